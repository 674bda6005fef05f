"""The block pool: which KV pages are free, who holds them, and which hold reusable content.

Bookkeeping over integers only. The tensors live in the backend; this file never sees them. A
page is one layer group's K/V for one block of a sequence (`core.py: CacheSpec`): with one
group (every layer alike) a page is a whole block, and the pool's ids are called blocks here.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable

# Eviction tiers of cached blocks, lowest leaves memory first (see `cache/pages/prefix.py`).
TIER_OUT_OF_WINDOW = 0  # a sliding layer group's page its sequence moved past: never to disk
TIER_ONE_OFF = 1  # a request with no agent: a title, a summary, a one-off prompt
TIER_IDLE_AGENT = 2  # an agent that has not been heard from for a while
TIER_WORKING_AGENT = 3  # an agent mid-conversation (it may be waiting on a tool call)
TIER_SHARED = 4  # content several agents use (a common system prompt)
TOP_TIER = TIER_SHARED

# (block, hash, tier it was cached at) of a cached block about to be reused
ReclaimHook = Callable[[int, int, int], None]


class BlockPool:
    """Hands out block ids and takes them back.

    Every block is in exactly one state:
      - free: on the free list, no content worth keeping;
      - held: refcount > 0 (one count per sequence or pin using it);
      - cached: refcount 0 but hashed, its content reusable; kept in LRU order within its
        eviction tier and reclaimed (lowest tier, oldest first) only when no block is free.
    Invariants (see `check_integrity`): free + held + cached == total; a block id appears once;
    a hash maps to one block and back. Releasing a block that is not held is a no-op, so a
    double release cannot corrupt another owner's count. A release never lowers a block's tier:
    a block cached before is cached again at least at the tier it last had, so a one-off request
    that reused an agent's blocks cannot demote them by finishing last; only `drop` does, for a
    page its sequence's window has moved past. `on_reclaim(block, hash, tier)` runs just before a
    cached block's content is dropped for reuse: the last moment to save it to disk. Within a
    tier, LRU order is the order of `clock()` when blocks were cached.
    """

    def __init__(
        self,
        num_blocks: int,
        on_reclaim: ReclaimHook | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if num_blocks < 1:
            raise ValueError("a block pool needs at least one block")
        self.num_blocks = num_blocks
        self.on_reclaim = on_reclaim
        self._free: list[int] = list(range(num_blocks - 1, -1, -1))  # pop() hands out 0 first
        self._refcount = [0] * num_blocks
        self._hash_of: dict[int, int] = {}
        self._block_of: dict[int, int] = {}
        # refcount-0 hashed blocks, one LRU (oldest first) per tier
        self._cached: list[OrderedDict[int, None]] = [OrderedDict() for _ in range(TOP_TIER + 1)]
        self._tier_of: dict[int, int] = {}
        self._cached_at: dict[int, float] = {}
        self._clock = clock
        # the tier each block was last cached at, kept while it is held, dropped with its content
        self._last_tier: dict[int, int] = {}
        self.reclaimed = [0] * (TOP_TIER + 1)  # cached blocks reclaimed for reuse, by tier

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_cached(self) -> int:
        return len(self._tier_of)

    @property
    def num_held(self) -> int:
        return self.num_blocks - self.num_free - self.num_cached

    def num_available(self, max_tier: int = TOP_TIER) -> int:
        """Blocks an allocation may take now: free ones plus cached ones up to `max_tier`."""
        return self.num_free + sum(len(self._cached[t]) for t in range(max_tier + 1))

    def allocate(self, count: int, max_tier: int = TOP_TIER) -> list[int]:
        """Take `count` blocks, each with refcount 1; all or nothing."""
        if count > self.num_available(max_tier):
            raise MemoryError(f"asked for {count} blocks, {self.num_available(max_tier)} available")
        blocks = [self._take_one() for _ in range(count)]
        for block in blocks:
            self._refcount[block] = 1
        return blocks

    def release(self, blocks: list[int], tier: int = TIER_ONE_OFF) -> None:
        """Drop one reference to each block; unreferenced blocks become cached (in `tier`, or the
        higher tier they were last cached at) when they have a hash, else free."""
        for block in blocks:
            if self._refcount[block] == 0:
                continue
            self._refcount[block] -= 1
            if self._refcount[block] == 0:
                if block in self._hash_of:
                    self._cache(block, max(tier, self._last_tier.get(block, tier)))
                else:
                    self._free.append(block)

    def drop(self, blocks: list[int]) -> None:
        """Drop one reference to each page a sequence no longer reads (its sliding window moved
        past it): an unreferenced one is cached in the out-of-window tier, whatever tier it had,
        so it is reclaimed before anything else (and never saved to disk); one without a hash is
        freed."""
        for block in blocks:
            if self._refcount[block] == 1 and block in self._hash_of:
                self._last_tier[block] = TIER_OUT_OF_WINDOW
        self.release(blocks, TIER_OUT_OF_WINDOW)

    def acquire(self, block: int) -> None:
        """Add a reference to a block found by hash (held or cached)."""
        if self._refcount[block] == 0:
            del self._cached[self._tier_of.pop(block)][block]
            del self._cached_at[block]
        self._refcount[block] += 1

    def retier(self, block: int, tier: int) -> None:
        """Move a cached block to another tier, keeping its recency; held blocks are unaffected
        (their tier is decided when they are released)."""
        old = self._tier_of.get(block)
        if old is not None and old != tier:
            del self._cached[old][block]
            self._cache(block, tier)

    def touch(self, block: int, tier: int = TIER_ONE_OFF) -> None:
        """Make a cached block the most recently used of its tier, raised to `tier` if lower;
        held blocks are unaffected."""
        old = self._tier_of.get(block)
        if old is not None:
            del self._cached[old][block]
            self._cache(block, max(old, tier))

    def demote_idle(self, idle_s: float) -> int:
        """Move working-tier blocks cached more than `idle_s` ago to the idle tier: a
        conversation silent that long is idle, named or not. Returns how many moved."""
        cutoff = self._clock() - idle_s
        working = self._cached[TIER_WORKING_AGENT]
        stale = []
        for block in working:  # oldest first; stops at the first recent one
            if self._cached_at[block] >= cutoff:
                break
            stale.append(block)
        for block in stale:
            self.retier(block, TIER_IDLE_AGENT)
        return len(stale)

    def discard(self, block: int) -> bool:
        """Drop a cached block's content without reclaiming it through the hook (its owner was
        deleted); it becomes free. Held blocks are left alone."""
        tier = self._tier_of.pop(block, None)
        if tier is None:
            return False
        del self._cached[tier][block]
        del self._cached_at[block]
        del self._last_tier[block]
        del self._block_of[self._hash_of.pop(block)]
        self._free.append(block)
        return True

    def set_hash(self, block: int, block_hash: int) -> bool:
        """Mark a held block's content as reusable under `block_hash`. False when the hash is
        already known (another block holds the same content) or the block has one."""
        if block in self._hash_of or block_hash in self._block_of:
            return False
        self._hash_of[block] = block_hash
        self._block_of[block_hash] = block
        return True

    def lookup(self, block_hash: int) -> int | None:
        return self._block_of.get(block_hash)

    def hash_of(self, block: int) -> int | None:
        return self._hash_of.get(block)

    def refcount(self, block: int) -> int:
        return self._refcount[block]

    def tier_of(self, block: int) -> int | None:
        return self._tier_of.get(block)

    def cached_blocks(self) -> list[int]:
        """Cached blocks, first to be reclaimed first."""
        return [block for tier in self._cached for block in tier]

    def _cache(self, block: int, tier: int) -> None:
        self._cached[tier][block] = None
        self._tier_of[block] = tier
        self._last_tier[block] = tier
        self._cached_at[block] = self._clock()

    def _take_one(self) -> int:
        if self._free:
            return self._free.pop()
        tier = next(t for t in range(TOP_TIER + 1) if self._cached[t])
        block, _ = self._cached[tier].popitem(last=False)
        self.reclaimed[tier] += 1
        del self._tier_of[block]
        del self._cached_at[block]
        del self._last_tier[block]
        block_hash = self._hash_of.pop(block)
        del self._block_of[block_hash]
        if self.on_reclaim is not None:
            self.on_reclaim(block, block_hash, tier)
        return block

    def check_integrity(self) -> None:
        """Raise AssertionError if any invariant is broken. Cheap enough for every test."""
        free = set(self._free)
        cached = {b for tier in self._cached for b in tier}
        held = {b for b in range(self.num_blocks) if self._refcount[b] > 0}
        assert len(free) == len(self._free), "a block is on the free list twice"
        assert sum(len(t) for t in self._cached) == len(cached), "a block is cached twice"
        assert not (free & cached) and not (free & held) and not (cached & held), (
            "block in 2 states"
        )
        assert len(free) + len(cached) + len(held) == self.num_blocks, "a block is lost"
        assert cached == set(self._tier_of) == set(self._cached_at), "tier index diverged"
        assert all(self._last_tier[b] == t for b, t in self._tier_of.items()), "last tier diverged"
        assert self._last_tier.keys() <= self._hash_of.keys(), "an unhashed block has a tier"
        assert all(b in self._hash_of for b in cached), "an unhashed block is cached"
        assert not (free & self._hash_of.keys()), "a free block still has a hash"
        assert all(self._block_of[h] == b for b, h in self._hash_of.items()), "hash map diverged"
        assert len(self._block_of) == len(self._hash_of), "hash map diverged"
