"""Prefix reuse: chained block hashes, and the longest cached prefix a new prompt can reuse.

Standard library only. A block's hash covers its tokens and, through its parent's hash, every
token before it, so equal hashes mean equal KV (the root is seeded with the model and the cache
geometry, so no other model's blocks ever match).
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from semantic.cache.block_pool import BlockPool

HASH_VERSION = 1

EvictHook = Callable[[int, int, int, tuple[int, ...]], None]


def _digest(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


def root_hash(model_tag: str) -> int:
    """The parent of every first block: one per model and cache geometry."""
    return _digest(f"semantic-prefix-v{HASH_VERSION}:{model_tag}".encode())


def chain_hash(parent: int, token_ids: Sequence[int]) -> int:
    """The hash of a block holding `token_ids` after the content hashed as `parent`. Stable
    across processes (disk files are named by it)."""
    return _digest(parent.to_bytes(8, "little") + array("q", token_ids).tobytes())


@dataclass(slots=True, frozen=True)
class PrefixMatch:
    """What a prompt can reuse: whole blocks to share as they are, then the first `tail_tokens`
    tokens of `tail_source`, a block to copy (its later slots belong to someone else)."""

    block_ids: list[int]
    block_hashes: list[int]
    tail_source: int | None
    tail_tokens: int
    block_tokens: int

    @property
    def num_tokens(self) -> int:
        return len(self.block_ids) * self.block_tokens + self.tail_tokens


class PrefixCache:
    """The content index over the pool's hashed blocks: which tokens each hash stands for and
    which blocks continue which. Full blocks and partial tails (the last, unfinished block of a
    history) are both indexed, so a continuing agent reuses everything it computed before.

    Invariant: every hash here is a block the pool holds or caches; the pool's reclaim hook
    removes it (after `on_evict` has had a chance to save the content).
    """

    def __init__(self, pool: BlockPool, block_tokens: int, root: int) -> None:
        self.pool = pool
        self.block_tokens = block_tokens
        self.root = root
        self.on_evict: EvictHook | None = None
        self._tokens: dict[int, tuple[int, ...]] = {}
        self._parent: dict[int, int] = {}
        self._children: dict[int, set[int]] = {}
        pool.on_reclaim = self._reclaimed

    def match(self, token_ids: Sequence[int]) -> PrefixMatch:
        """The longest cached prefix of `token_ids`, never including the last token (its logits
        are needed, so it is always computed)."""
        limit, size = len(token_ids) - 1, self.block_tokens
        parent, blocks, hashes, start = self.root, [], [], 0
        while start + size <= limit:
            tokens = tuple(token_ids[start : start + size])
            block_hash = chain_hash(parent, tokens)
            block = self.pool.lookup(block_hash)
            if block is None or self._tokens.get(block_hash) != tokens:  # verify, never trust
                break
            blocks.append(block)
            hashes.append(block_hash)
            parent, start = block_hash, start + size
        source, count = self._best_continuation(parent, token_ids[start:limit])
        return PrefixMatch(blocks, hashes, source, count, size)

    def _best_continuation(self, parent: int, rest: Sequence[int]) -> tuple[int | None, int]:
        best, best_count = None, 0
        for child in self._children.get(parent, ()):
            count = _common_prefix(self._tokens[child], rest)
            if count > best_count:
                best, best_count = self.pool.lookup(child), count
        return best, best_count

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
