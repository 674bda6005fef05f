"""Prefix reuse: chained block hashes, and the longest cached prefix a new prompt can reuse, in
the pool or below it (on disk).

Standard library only. A block's hash covers its tokens and, through its parent's hash, every
token before it, so equal hashes mean equal KV (the root is seeded with the model and the cache
geometry, so no other model's blocks ever match).
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from semantic.cache.block_pool import BlockPool

HASH_VERSION = 1

EvictHook = Callable[[int, int, int, tuple[int, ...]], None]
_Tail = tuple[int | None, int | None, int, bool]


def _digest(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


def root_hash(model_tag: str) -> int:
    """The parent of every first block: one per model and cache geometry."""
    return _digest(f"semantic-prefix-v{HASH_VERSION}:{model_tag}".encode())


def chain_hash(parent: int, token_ids: Sequence[int]) -> int:
    """The hash of a block holding `token_ids` after the content hashed as `parent`. Stable
    across processes (disk files are named by it)."""
    return _digest(parent.to_bytes(8, "little") + array("q", token_ids).tobytes())


class LowerTier(Protocol):
    """Where the pool's blocks go when it lets them go (the disk), asked what it holds."""

    def contains(self, block_hash: int) -> bool: ...

    def tails(self, parent: int) -> list[tuple[int, tuple[int, ...]]]:
        """(hash, token ids) of the partial blocks it holds that continue `parent`."""
        ...


class NoLowerTier:
    """A pool with nothing below it."""

    def contains(self, block_hash: int) -> bool:
        return False

    def tails(self, parent: int) -> list[tuple[int, tuple[int, ...]]]:
        return []


@dataclass(slots=True, frozen=True)
class PrefixMatch:
    """What a prompt can reuse, in chain order. Full block i is `blocks[i]` in the pool, shared as
    it is, or None when only the lower tier has it (`hashes[i]`): restored into a fresh block.
    Then the first `tail_tokens` tokens of the partial block `tail_hash`: a pool block
    (`tail_block`, copied, since its later slots belong to someone else) or, when `tail_block`
    is None, a block on the lower tier (restored). `extends_history` says the tail matched whole:
    the prompt continues a history someone left, a conversation whether it was named or not.
    `missing` is the hash of the first full block found nowhere (None when the chain ran out of
    prompt first), so a miss can say why."""

    blocks: list[int | None]
    hashes: list[int]
    tail_hash: int | None
    tail_block: int | None
    tail_tokens: int
    extends_history: bool
    missing: int | None
    block_tokens: int

    @property
    def num_tokens(self) -> int:
        return len(self.blocks) * self.block_tokens + self.tail_tokens

    @property
    def in_memory(self) -> list[int]:
        """The pool blocks it reuses: full ones, then the tail to copy."""
        tail = [] if self.tail_block is None else [self.tail_block]
        return [b for b in self.blocks if b is not None] + tail

    @property
    def to_restore(self) -> list[int]:
        """Hashes to read from the lower tier, in chain order (the tail last)."""
        full = [h for b, h in zip(self.blocks, self.hashes, strict=True) if b is None]
        tail_below = self.tail_hash is not None and self.tail_block is None
        return full + ([self.tail_hash] if tail_below and self.tail_hash is not None else [])


class PrefixCache:
    """The content index over the pool's hashed blocks: which tokens each hash stands for and
    which blocks continue which. Full blocks and partial tails (the last, unfinished block of a
    history) are both indexed, so a continuing agent reuses everything it computed before.

    The lower tier is asked only where the pool has nothing: a block on both is shared from the
    pool. Invariant: every hash here is a block the pool holds or caches; the pool's reclaim
    hook removes it, after `on_evict` has had the chance to save the content below.
    """

    def __init__(
        self,
        pool: BlockPool,
        block_tokens: int,
        root: int,
        *,
        lower: LowerTier | None = None,
        on_evict: EvictHook | None = None,
    ) -> None:
        self.pool = pool
        self.block_tokens = block_tokens
        self.root = root
        self.lower = lower or NoLowerTier()
        self.on_evict = on_evict
        self._tokens: dict[int, tuple[int, ...]] = {}
        self._parent: dict[int, int] = {}
        self._children: dict[int, set[int]] = {}
        pool.on_reclaim = self._reclaimed

    def match(self, token_ids: Sequence[int]) -> PrefixMatch:
        """The longest cached prefix of `token_ids`, in the pool or below it, never including
        the last token (its logits are needed, so it is always computed)."""
        limit, size = len(token_ids) - 1, self.block_tokens
        parent, start = self.root, 0
        blocks: list[int | None] = []
        hashes: list[int] = []
        missing = None
        while start + size <= limit:
            tokens = tuple(token_ids[start : start + size])
            block_hash = chain_hash(parent, tokens)
            block = self.pool.lookup(block_hash)
            if block is not None and self._tokens.get(block_hash) != tokens:  # never trust
                block = None
            if block is None and not self.lower.contains(block_hash):
                missing = block_hash
                break
            blocks.append(block)
            hashes.append(block_hash)
            parent, start = block_hash, start + size
        tail = self._best_tail(parent, token_ids[start:limit])
        return PrefixMatch(blocks, hashes, *tail, missing, size)

    def _best_tail(
        self, parent: int, rest: Sequence[int]
    ) -> tuple[int | None, int | None, int, bool]:
        """(hash, pool block or None, tokens matched, matched whole) of the partial or full
        block under `parent` that shares the longest start with `rest`; the pool wins ties."""
        best: tuple[int | None, int | None, int, bool] = (None, None, 0, False)
        for child in self._children.get(parent, ()):
            tokens = self._tokens[child]
            count = _common_prefix(tokens, rest)
            if count > best[2]:
                best = (child, self.pool.lookup(child), count, count == len(tokens))
        for child, tokens in self.lower.tails(parent):
            count = _common_prefix(tokens, rest)
            if count > best[2] and child not in self._tokens:
                best = (child, None, count, count == len(tokens))
        return best

    def touch(self, match: PrefixMatch, tier: int) -> None:
        """A request waits for these blocks: make them the last of their tier (raised to the
        request's `tier` if lower) to be reclaimed."""
        for block in match.in_memory:
            self.pool.touch(block, tier)

    def register(self, block: int, parent: int, token_ids: Sequence[int]) -> int:
        """Index a held block's content (a full block, or a history's partial tail); returns its
        hash. Content already indexed under another block is left to that block."""
        block_hash = chain_hash(parent, token_ids)
        if self.pool.set_hash(block, block_hash):
            self._tokens[block_hash] = tuple(token_ids)
            self._parent[block_hash] = parent
            self._children.setdefault(parent, set()).add(block_hash)
        return block_hash

    def insert(self, block: int, block_hash: int, parent: int, token_ids: Sequence[int]) -> bool:
        """Index a block restored from disk under the hash it was saved with."""
        if block_hash != chain_hash(parent, token_ids) or not self.pool.set_hash(block, block_hash):
            return False
        self._tokens[block_hash] = tuple(token_ids)
        self._parent[block_hash] = parent
        self._children.setdefault(parent, set()).add(block_hash)
        return True

    def contains(self, block_hash: int) -> bool:
        return block_hash in self._tokens

    def content(self, block_hash: int) -> tuple[int, tuple[int, ...]] | None:
        """(parent hash, token ids) of an indexed block."""
        if block_hash not in self._tokens:
            return None
        return self._parent[block_hash], self._tokens[block_hash]

    def discard(self, block_hash: int) -> bool:
        """Forget a cached block's content and free its block, without saving it anywhere (its
        agent was deleted). A block someone holds is kept."""
        block = self.pool.lookup(block_hash)
        if block is None or not self.pool.discard(block):
            return False
        self._forget(block_hash)
        return True

    def _reclaimed(self, block: int, block_hash: int) -> None:
        parent, tokens = self._forget(block_hash)
        if self.on_evict is not None:
            self.on_evict(block, block_hash, parent, tokens)

    def _forget(self, block_hash: int) -> tuple[int, tuple[int, ...]]:
        parent, tokens = self._parent.pop(block_hash), self._tokens.pop(block_hash)
        siblings = self._children[parent]
        siblings.discard(block_hash)
        if not siblings:
            del self._children[parent]
        return parent, tokens

    def check_integrity(self) -> None:
        assert set(self._tokens) == set(self._parent), "content index diverged"
        for block_hash in self._tokens:
            block = self.pool.lookup(block_hash)
            assert block is not None, "an indexed hash has no block"
            assert block_hash in self._children[self._parent[block_hash]], "child index diverged"


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    count = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        count += 1
    return count
