"""Prefix reuse: chained block hashes, and the longest cached prefix a new prompt can reuse, in
the pool or below it (on disk).

Standard library only. A block's hash covers its tokens and, through its parent's hash, every
token before it, so equal hashes mean equal KV (the root is seeded with the model and the cache
geometry, so no other model's blocks ever match, and with the API key's owner, so no other key's
blocks do either: `owner_root`). A block's KV is stored as one page per layer
group (`core.py: CacheSpec`), each known by its page key (`page_key`): the block's hash and the
group.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from semantic.cache.pages.block_pool import TIER_OUT_OF_WINDOW, BlockPool
from semantic.core import first_read_block

HASH_VERSION = 1
# A page key is its block's 64-bit chain hash with the layer group above it: group 0's key is
# the block's hash itself, so a model with one group keys pages (and files) by block hash.
_GROUP_SHIFT = 64
_HASH_MASK = (1 << _GROUP_SHIFT) - 1

# (pool page, page key, parent hash, token ids, whether a history ended at the block: set on its
# first group's page alone, as `marks_history_end` says).
EvictHook = Callable[[int, int, int, tuple[int, ...], bool], None]


def _digest(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


def root_hash(model_tag: str) -> int:
    """The parent of every first block: one per model and cache geometry."""
    return _digest(f"semantic-prefix-v{HASH_VERSION}:{model_tag}".encode())


def owner_root(model_root: int, owner: str) -> int:
    """The parent of every first block of one owner's prompts (an API key's, `AgentKey.owner`):
    another key's identical prompt starts another chain, so no key learns from the cache what
    another key's prompts held (a match reports how many of its tokens were cached, a token at a
    time inside a block). vLLM's `cache_salt` does the same."""
    return _digest(model_root.to_bytes(8, "little") + f"owner:{owner}".encode())


def chain_hash(parent: int, token_ids: Sequence[int]) -> int:
    """The hash of a block holding `token_ids` after the content hashed as `parent`. Stable
    across processes (disk files are named by it)."""
    return _digest(parent.to_bytes(8, "little") + array("q", token_ids).tobytes())


def page_key(block_hash: int, group: int) -> int:
    """The key of one layer group's page of a block, in the pool and on disk."""
    return block_hash | group << _GROUP_SHIFT


def split_key(key: int) -> tuple[int, int]:
    """(block hash, layer group) of a page key."""
    return key & _HASH_MASK, key >> _GROUP_SHIFT


class LowerTier(Protocol):
    """Where the pool's pages go when it lets them go (the disk), asked what it holds."""

    def contains(self, key: int) -> bool: ...

    def tails(self, parent: int) -> list[tuple[int, tuple[int, ...]]]:
        """(hash, token ids) of the partial blocks it holds that continue `parent` (known by
        their first group's page)."""
        ...

    def ends_history(self, block_hash: int) -> bool:
        """Whether a history ended exactly at this block, which it holds (its first group's
        page carries the mark)."""
        ...

    def end_history(self, block_hash: int) -> None:
        """A history ended exactly at this block, whose first group's page it holds: keep the
        mark with that page."""
        ...


class NoLowerTier:
    """A pool with nothing below it."""

    def contains(self, key: int) -> bool:
        return False

    def tails(self, parent: int) -> list[tuple[int, tuple[int, ...]]]:
        return []

    def ends_history(self, block_hash: int) -> bool:
        return False

    def end_history(self, block_hash: int) -> None:
        pass


@dataclass(slots=True, frozen=True)
class PrefixMatch:
    """What a prompt can reuse: the full blocks hashed as `hashes`, then the first `tail_tokens`
    tokens of the partial block `tail_hash` (None: no tail).

    `pages[g]` lists layer group g's pages of the blocks from `first[g]` on — a group with a
    sliding window needs only the blocks its window still reads after `num_tokens` tokens —
    the full blocks', then the tail's: a pool page, shared as it is (the tail's is copied,
    since its later slots belong to someone else), or None where only the lower tier has it:
    restored into a fresh page. `extends_history` says the tail matched whole (or, with no tail,
    the last full block is where a history ended): the prompt continues a history someone left,
    a conversation whether it was named or not. `missing` is
    the hash of the first full block it could not reuse (None when the chain ran out of prompt
    first), so a miss can say why; `reach` is how many tokens the full-attention groups had,
    more than `num_tokens` when the match was cut back for a sliding window's missing pages."""

    hashes: list[int]
    tail_hash: int | None
    tail_tokens: int
    pages: list[list[int | None]]
    first: list[int]
    extends_history: bool
    missing: int | None
    block_tokens: int
    reach: int

    @property
    def num_tokens(self) -> int:
        return len(self.hashes) * self.block_tokens + self.tail_tokens

    def entries(self) -> list[tuple[int, int, int | None]]:
        """(block index, group, pool page or None) of every page it reuses, in chain order."""
        found = [
            (self.first[group] + i, group, page)
            for group, pages in enumerate(self.pages)
            for i, page in enumerate(pages)
        ]
        return sorted(found, key=lambda entry: entry[:2])

    def key(self, index: int, group: int) -> int:
        """The page key of block `index` (the tail's when it is the last) in `group`."""
        block_hash = self.hashes[index] if index < len(self.hashes) else self.tail_hash
        assert block_hash is not None
        return page_key(block_hash, group)

    @property
    def in_memory(self) -> list[int]:
        """The pool pages it reuses: full blocks' shared, the tail's copied."""
        return [page for _, _, page in self.entries() if page is not None]

    @property
    def num_shared(self) -> int:
        """Pool pages it shares as they are (full blocks': a tail's is copied)."""
        return sum(
            page is not None and index < len(self.hashes) for index, _, page in self.entries()
        )

    @property
    def to_restore(self) -> list[int]:
        """Page keys to read from the lower tier, in chain order (the tail's last)."""
        return [self.key(i, g) for i, g, page in self.entries() if page is None]


class PrefixCache:
    """The content index over the pool's hashed pages: which tokens each block hash stands for
    and which blocks continue which. Full blocks and partial tails (the last, unfinished block
    of a history) are both indexed, so a continuing agent reuses everything it computed before.

    A block is stored as one page per layer group (`group_windows`: each group's sliding window,
    None for full attention). A prefix of m tokens is reusable when every full-attention group
    has the pages of all its blocks and every sliding group those of the blocks its window
    reads at m; a sliding group's older pages are not needed, and may be gone (K/V of a sliding
    layer cannot be computed again without everything before it, so a match is cut short where
    a window's pages are missing).

    The lower tier is asked only where the pool has nothing: a page on both is shared from the
    pool. Invariant: every hash indexed here has a page the pool holds or caches; the pool's
    reclaim hook forgets it with its last page, after `on_evict` has had the chance to save each
    page below (every page but those reclaimed out of their window, which nothing reads).

    The mark of a full block where a history ended (`end_history`) lives with the block's
    first group's page: in the pool here, on the lower tier once that page is there (saved
    with it, or sent down when the history ends on a block the lower tier holds already), and
    back here when the page is restored. So a conversation's next turn is known as one
    whichever tier its last block is on, and after a restart.

    Each owner's prompts hash under a root of their own (`root_of`), unless the owners trust one
    another (`share_across_owners`); prompts without an owner (a server without keys) hash under
    the model's `root`, as before owners had roots.
    """

    def __init__(
        self,
        pool: BlockPool,
        block_tokens: int,
        root: int,
        *,
        group_windows: Sequence[int | None] = (None,),
        lower: LowerTier | None = None,
        on_evict: EvictHook | None = None,
        share_across_owners: bool = False,
    ) -> None:
        self.pool = pool
        self.block_tokens = block_tokens
        self.root = root
        self.share_across_owners = share_across_owners
        self.windows = tuple(group_windows)
        self.lower = lower or NoLowerTier()
        self.on_evict = on_evict
        self._tokens: dict[int, tuple[int, ...]] = {}
        self._parent: dict[int, int] = {}
        self._children: dict[int, set[int]] = {}
        # Full blocks a history ended with exactly (it left no partial tail to match whole).
        self._history_ends: set[int] = set()
        self._full_groups = [g for g, window in enumerate(self.windows) if window is None]
        pool.on_reclaim = self._reclaimed

    def root_of(self, owner: str | None) -> int:
        """The root of the chains of `owner`'s prompts (None: no owner)."""
        if owner is None or self.share_across_owners:
            return self.root
        return owner_root(self.root, owner)

    def match(self, token_ids: Sequence[int], root: int) -> PrefixMatch:
        """The longest cached prefix of `token_ids` in the chain from `root` (its owner's:
        `root_of`), in the pool or below it, never including
        the last token (its logits are needed, so it is always computed): the chain of full
        blocks every full-attention group has, then the longest partial block under it; cut
        back, a block at a time, to where each sliding group has the window it reads."""
        limit, size = len(token_ids) - 1, self.block_tokens
        blocks, missing = self._chain(token_ids, limit, root)
        windows = _Windows(self, blocks)
        reach: int | None = None
        for count in range(len(blocks), -1, -1):
            if count < len(blocks):
                missing = blocks[count][0]
            parent = blocks[count - 1][0] if count else root
            tail = self._best_tail(parent, token_ids[count * size : limit])
            if reach is None:  # as far as the full-attention groups go
                reach = count * size + (tail[1] if tail is not None else 0)
            if tail is not None and windows.covered(count, tail[1]):
                return self._matched(blocks[:count], tail, missing, reach)
            if windows.covered(count, 0):
                return self._matched(blocks[:count], None, missing, reach)
        raise AssertionError("an empty prefix needs no window")

    def _chain(
        self, token_ids: Sequence[int], limit: int, root: int
    ) -> tuple[list[tuple[int, tuple[int, ...]]], int | None]:
        """(hash, tokens) of the full blocks of `token_ids[:limit]` that every full-attention
        group has, in the pool or below it (all of them when no group reads every block), and
        the hash of the first that one lacks."""
        size, parent = self.block_tokens, root
        blocks: list[tuple[int, tuple[int, ...]]] = []
        while (start := len(blocks) * size) + size <= limit:
            tokens = tuple(token_ids[start : start + size])
            block_hash = chain_hash(parent, tokens)
            if not all(self._has(block_hash, g, tokens) for g in self._full_groups):
                return blocks, block_hash
            blocks.append((block_hash, tokens))
            parent = block_hash
        return blocks, None

    def _matched(
        self,
        blocks: list[tuple[int, tuple[int, ...]]],
        tail: tuple[int, int, bool] | None,
        missing: int | None,
        reach: int,
    ) -> PrefixMatch:
        tail_hash, tail_tokens, whole = tail if tail is not None else (None, 0, False)
        if tail is None and blocks:
            last = blocks[-1][0]
            whole = last in self._history_ends or self.lower.ends_history(last)
        num_tokens = len(blocks) * self.block_tokens + tail_tokens
        tail_block = (tail_hash, self._tokens.get(tail_hash, ())) if tail_hash is not None else None
        chain = [*blocks, *([tail_block] if tail_block is not None else [])]
        first = [first_read_block(w, num_tokens, self.block_tokens) for w in self.windows]
        pages = [
            [self._page(h, g, tokens) for h, tokens in chain[first[g] :]]
            for g in range(len(self.windows))
        ]
        hashes = [block_hash for block_hash, _ in blocks]
        return PrefixMatch(
            hashes, tail_hash, tail_tokens, pages, first, whole, missing, self.block_tokens, reach
        )

    def _page(self, block_hash: int, group: int, tokens: tuple[int, ...]) -> int | None:
        """The pool page of a block's group, if the pool holds that content (a hash is never
        trusted alone: the token ids must agree)."""
        page = self.pool.lookup(page_key(block_hash, group))
        return page if page is not None and self._tokens.get(block_hash) == tokens else None

    def _has(self, block_hash: int, group: int, tokens: tuple[int, ...]) -> bool:
        """Whether a block's group page is in the pool or below it."""
        if self._page(block_hash, group, tokens) is not None:
            return True
        return self.lower.contains(page_key(block_hash, group))

    def _best_tail(self, parent: int, rest: Sequence[int]) -> tuple[int, int, bool] | None:
        """(hash, tokens matched, matched whole) of the partial or full block under `parent`
        that shares the longest start with `rest` and has every group's page somewhere; the
        pool wins ties."""
        candidates = [(child, self._tokens[child]) for child in self._children.get(parent, ())]
        candidates += [(c, t) for c, t in self.lower.tails(parent) if c not in self._tokens]
        best: tuple[int, int, bool] | None = None
        for child, tokens in candidates:
            count = common_prefix(tokens, rest)
            if count > (best[1] if best else 0) and all(
                self._has(child, g, tokens) for g in range(len(self.windows))
            ):
                best = (child, count, count == len(tokens))
        return best

    def touch(self, match: PrefixMatch, tier: int) -> None:
        """A request waits for these pages: make them the last of their tier (raised to the
        request's `tier` if lower) to be reclaimed."""
        for page in match.in_memory:
            self.pool.touch(page, tier)

    def register(self, pages: Sequence[int], parent: int, token_ids: Sequence[int]) -> int:
        """Index a block's content (a full block, or a history's partial tail), held as
        `pages[g]` in each group g; returns its hash. Content already indexed under other pages
        is left to them."""
        block_hash = chain_hash(parent, token_ids)
        added = [self.pool.set_hash(p, page_key(block_hash, g)) for g, p in enumerate(pages)]
        if any(added) and block_hash not in self._tokens:
            self._index(block_hash, parent, token_ids)
        return block_hash

    def insert(self, page: int, key: int, parent: int, token_ids: Sequence[int]) -> bool:
        """Index a page restored from disk under the key it was saved with."""
        block_hash, _ = split_key(key)
        if block_hash != chain_hash(parent, token_ids) or not self.pool.set_hash(page, key):
            return False
        if block_hash not in self._tokens:
            self._index(block_hash, parent, token_ids)
        if self.lower.ends_history(block_hash):
            self._history_ends.add(block_hash)  # its mark comes back with it
        return True

    def _index(self, block_hash: int, parent: int, token_ids: Sequence[int]) -> None:
        self._tokens[block_hash] = tuple(token_ids)
        self._parent[block_hash] = parent
        self._children.setdefault(parent, set()).add(block_hash)

    def contains(self, block_hash: int) -> bool:
        return block_hash in self._tokens

    def content(self, block_hash: int) -> tuple[int, tuple[int, ...]] | None:
        """(parent hash, token ids) of an indexed block."""
        if block_hash not in self._tokens:
            return None
        return self._parent[block_hash], self._tokens[block_hash]

    def keys(self, block_hash: int) -> list[int]:
        """The page keys of a block, one per group."""
        return [page_key(block_hash, g) for g in range(len(self.windows))]

    def pages(self, block_hash: int) -> list[tuple[int, int]]:
        """(key, page) of the block's pages in the pool."""
        found = ((key, self.pool.lookup(key)) for key in self.keys(block_hash))
        return [(key, page) for key, page in found if page is not None]

    def chain(self, token_ids: Sequence[int], root: int) -> list[int]:
        """The chain hashes of the full blocks of `token_ids` from `root`, cached or not."""
        hashes, parent, size = [], root, self.block_tokens
        for start in range(0, len(token_ids) - size + 1, size):
            parent = chain_hash(parent, token_ids[start : start + size])
            hashes.append(parent)
        return hashes

    def history_keys(self, hashes: Sequence[int], num_tokens: int) -> list[int]:
        """The page keys that the next turn of a history reads: the history's blocks `hashes`
        (its partial tail last, if any) of `num_tokens` tokens, in every full-attention group,
        and those its window still reads in each sliding group."""
        keys = []
        for group, window in enumerate(self.windows):
            first = first_read_block(window, num_tokens, self.block_tokens)
            keys += [page_key(block_hash, group) for block_hash in hashes[first:]]
        return keys

    def history_pages(self, hashes: Sequence[int], num_tokens: int) -> list[tuple[int, int]]:
        """(key, page) of the pool pages that the next turn of a history reads."""
        found = ((key, self.pool.lookup(key)) for key in self.history_keys(hashes, num_tokens))
        return [(key, page) for key, page in found if page is not None]

    def is_sliding(self, key: int) -> bool:
        """Whether a page key is a sliding group's (read only while a window holds it)."""
        return self.windows[split_key(key)[1]] is not None

    def hot_pages(self) -> list[tuple[int, int]]:
        """(key, page) of every hashed page in the pool worth saving: all but those cached out
        of their window."""
        hot = []
        for page in range(self.pool.num_blocks):
            key = self.pool.hash_of(page)
            if key is not None and self.pool.tier_of(page) != TIER_OUT_OF_WINDOW:
                hot.append((key, page))
        return hot

    def discard(self, key: int) -> bool:
        """Forget a cached page and free it, without saving it anywhere (its agent was deleted,
        or it is on disk already). A page someone holds is kept."""
        page = self.pool.lookup(key)
        if page is None or not self.pool.discard(page):
            return False
        self._forget_if_gone(split_key(key)[0])
        return True

    def _reclaimed(self, page: int, key: int, tier: int) -> None:
        block_hash, _ = split_key(key)
        parent, tokens = self._parent[block_hash], self._tokens[block_hash]
        ends_history = self.marks_history_end(key)  # before the block is forgotten
        self._forget_if_gone(block_hash)
        if self.on_evict is not None and tier != TIER_OUT_OF_WINDOW:
            self.on_evict(page, key, parent, tokens, ends_history)

    def _forget_if_gone(self, block_hash: int) -> None:
        """Forget a block's content once the pool has none of its pages."""
        if any(self.pool.lookup(key) is not None for key in self.keys(block_hash)):
            return
        parent = self._parent.pop(block_hash)
        del self._tokens[block_hash]
        self._history_ends.discard(block_hash)
        siblings = self._children[parent]
        siblings.discard(block_hash)
        if not siblings:
            del self._children[parent]

    def end_history(self, block_hash: int) -> None:
        """A history ends exactly at the end of this full block, with no partial tail: a prompt
        that continues from it extends that history (a conversation's next turn). Marked here
        while the pool has the block, and on the lower tier too when that holds its first
        page already (say, restored from there), since a page the disk has is never saved
        again: else the mark would leave memory with the block."""
        if block_hash in self._tokens:
            self._history_ends.add(block_hash)
        if self.lower.contains(page_key(block_hash, 0)):
            self.lower.end_history(block_hash)

    def marks_history_end(self, key: int) -> bool:
        """Whether a page carries its block's history-end mark down to the lower tier: the
        first group's page of a block where a history ended."""
        block_hash, group = split_key(key)
        return group == 0 and block_hash in self._history_ends

    def check_integrity(self) -> None:
        assert set(self._tokens) == set(self._parent), "content index diverged"
        assert self._history_ends <= set(self._tokens), "a history's end outlived its block"
        for block_hash in self._tokens:
            assert self.pages(block_hash), "an indexed hash has no page"
            assert block_hash in self._children[self._parent[block_hash]], "child index diverged"
        for page in range(self.pool.num_blocks):
            key = self.pool.hash_of(page)
            assert key is None or split_key(key)[0] in self._tokens, "a page's content is lost"


class _Windows:
    """Whether the sliding groups have the pages a prefix of the chain `blocks` needs: each
    block's pages looked up once per match."""

    def __init__(self, cache: PrefixCache, blocks: list[tuple[int, tuple[int, ...]]]) -> None:
        self.cache = cache
        self.blocks = blocks
        self._known: dict[tuple[int, int], bool] = {}

    def covered(self, count: int, tail_tokens: int) -> bool:
        """Whether each sliding group has the pages its window reads after the first `count`
        blocks (and `tail_tokens` of a tail after them, whose own pages are known to be
        there)."""
        cache, size = self.cache, self.cache.block_tokens
        num_tokens = count * size + tail_tokens
        for group, window in enumerate(cache.windows):
            first = first_read_block(window, num_tokens, size)
            if window is not None and not all(self._has(i, group) for i in range(first, count)):
                return False
        return True

    def _has(self, index: int, group: int) -> bool:
        known = self._known.get((index, group))
        if known is None:
            block_hash, tokens = self.blocks[index]
            known = self._known[index, group] = self.cache._has(block_hash, group, tokens)
        return known


def common_prefix(a: Sequence[object], b: Sequence[object]) -> int:
    """How many items `a` and `b` start with alike (token ids, or characters)."""
    count = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        count += 1
    return count
