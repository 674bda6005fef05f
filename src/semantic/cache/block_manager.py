"""The blocks each sequence holds: what admitting it would reuse and take, its block table
(shared pool blocks, copies, fresh blocks, blocks to restore from disk), hashing blocks as they
fill, caching its partial last block, and giving everything back.

Standard library and the block pool only; the scheduler decides when, this file decides which
blocks.
"""

from __future__ import annotations

from dataclasses import dataclass

from semantic.cache.block_pool import (
    TIER_IDLE_AGENT,
    TIER_ONE_OFF,
    TIER_WORKING_AGENT,
    TOP_TIER,
)
from semantic.cache.prefix import PrefixCache, PrefixMatch
from semantic.core import Restore, Sequence


@dataclass(slots=True, frozen=True)
class Fit:
    """Admitting a sequence now: its prefix match, the eviction tier its blocks get and the
    highest it may reclaim, the fresh blocks it takes, and how many of those it lacks (≤ 0:
    it fits)."""

    match: PrefixMatch
    tier: int
    max_tier: int
    needed: int
    lacking: int


class BlockManager:
    """Allocates, shares, copies and releases a sequence's blocks over the pool and its prefix
    index. A reused partial block is copied into the sequence's own block by the next step
    (`take_copies`); its source is held until that step has run.

    Invariant: a sequence's `block_ids` hold one reference each, released exactly once.
    """

    def __init__(self, prefix: PrefixCache, block_tokens: int) -> None:
        self.prefix = prefix
        self.pool = prefix.pool
        self.block_tokens = block_tokens
        self._copies: list[tuple[int, int]] = []
        self._copy_sources: list[tuple[int, int]] = []  # (block, tier) held until copied

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_tokens)

    def fit(self, seq: Sequence, headroom: int) -> Fit:
        """What admitting `seq` now would reuse and take, and how many blocks it lacks, keeping
        `headroom` blocks available for others (one per running sequence, so admitting does
        not force the next decode step to preempt)."""
        match = self.prefix.match(seq.token_ids)
        tier = seq.cache_tier if seq.first_scheduled_time is not None else tier_of(seq, match)
        # A one-off may not reclaim agents' blocks — unless it was preempted: finishing what was
        # started beats keeping a cache, and it could otherwise wait for ever.
        one_off = tier == TIER_ONE_OFF and not seq.started
        max_tier = TIER_IDLE_AGENT if one_off else TOP_TIER
        # Cached blocks we are about to reuse cannot also be reclaimed for the rest (a held
        # block has no tier and was never counted as available).
        reclaimable_reused = sum(
            1 for b in match.in_memory if (t := self.pool.tier_of(b)) is not None and t <= max_tier
        )
        needed = self.blocks_for(len(seq.token_ids)) - sum(b is not None for b in match.blocks)
        available = self.pool.num_available(max_tier) - reclaimable_reused - headroom
        return Fit(match, tier, max_tier, needed, needed - available)

    def admit(self, seq: Sequence, fit: Fit) -> Restore | None:
        """Give `seq` its block table: the pool blocks it reuses (shared; a partial one copied
        into a fresh block), fresh blocks for the rest. Returns the restore of the blocks only
        the disk has (into their fresh blocks), or None when the pool had everything."""
        match = fit.match
        if match.tail_block is not None:
            self._copy_sources.append((match.tail_block, self._tier_of_cached(match.tail_block)))
        for block in match.in_memory:
            self.pool.acquire(block)
        fresh = iter(self.pool.allocate(fit.needed, fit.max_tier))
        seq.block_ids = [b if b is not None else next(fresh) for b in match.blocks]
        seq.block_ids += fresh
        if match.tail_block is not None:
            self._copies.append((match.tail_block, seq.block_ids[len(match.blocks)]))
        return self._restore_plan(seq, match)

    def take_copies(self) -> list[tuple[int, int]]:
        """The block copies the next step must make first; their sources are released after."""
        copies, self._copies = self._copies, []
        return copies

    def release_copy_sources(self) -> None:
        """Copy sources are held until the step that copies them has run."""
        for block, tier in self._copy_sources:
            self.pool.release([block], tier)
        self._copy_sources = []

    def grow(self, seq: Sequence) -> bool:
        """A block for the next token of a decoding sequence, when it needs one; False when the
        pool has none. A running sequence may reclaim any cached block: finishing what was
        started beats keeping a cache (the tier limit applies to admission only)."""
        if self.blocks_for(len(seq.token_ids)) <= len(seq.block_ids):
            return True
        if not self.pool.num_available():
            return False
        seq.block_ids += self.pool.allocate(1)
        return True

    def freed_by(self, seq: Sequence, max_tier: int) -> int:
        """Blocks releasing `seq` would make available to an admission limited to `max_tier`:
        those only it holds, when it caches at that tier or below."""
        if seq.cache_tier > max_tier:
            return 0
        return sum(1 for block in seq.block_ids if self.pool.refcount(block) == 1)

    def index_restored(self, seq: Sequence, restore: Restore, count: int) -> None:
        """Index the full blocks of `restore` that arrived (its first `count`), so others share
        them as they share computed ones."""
        size = self.block_tokens
        arrived = zip(restore.blocks[:count], restore.hashes, restore.indexes, strict=False)
        for block, block_hash, index in arrived:
            if index < len(restore.block_hashes):
                parent = restore.block_hashes[index - 1] if index else self.prefix.root
                tokens = seq.token_ids[index * size : (index + 1) * size]
                self.prefix.insert(block, block_hash, parent, tokens)

    def hash_full_blocks(self, seq: Sequence) -> None:
        """Index the blocks that just filled up: from now on other requests can share them."""
        size = self.block_tokens
        while (len(seq.block_hashes) + 1) * size <= seq.num_computed_tokens:
            index = len(seq.block_hashes)
            parent = seq.block_hashes[-1] if seq.block_hashes else self.prefix.root
            tokens = seq.token_ids[index * size : (index + 1) * size]
            seq.block_hashes.append(self.prefix.register(seq.block_ids[index], parent, tokens))

    def cache_tail(self, seq: Sequence) -> int | None:
        """Index the partial last block, so the next turn of this history reuses it."""
        full = len(seq.block_hashes)
        start = full * self.block_tokens
        if seq.num_computed_tokens <= start or len(seq.block_ids) <= full:
            return None
        parent = seq.block_hashes[-1] if full else self.prefix.root
        tokens = seq.token_ids[start : seq.num_computed_tokens]
        return self.prefix.register(seq.block_ids[full], parent, tokens)

    def release(self, seq: Sequence) -> None:
        """Give back every block of `seq`; hashed ones stay cached at its tier."""
        self.pool.release(seq.block_ids, seq.cache_tier)
        seq.block_ids = []
        seq.block_hashes = []

    def _restore_plan(self, seq: Sequence, match: PrefixMatch) -> Restore | None:
        indexes = [i for i, block in enumerate(match.blocks) if block is None]
        tail_tokens = 0
        if match.tail_hash is not None and match.tail_block is None:
            indexes.append(len(match.blocks))
            tail_tokens = match.tail_tokens
        if not indexes:
            return None
        full = len(indexes) - (tail_tokens > 0)
        return Restore(
            blocks=[seq.block_ids[i] for i in indexes],
            hashes=match.to_restore,
            indexes=indexes,
            tail_tokens=tail_tokens,
            num_tokens=match.num_tokens,
            disk_tokens=full * self.block_tokens + tail_tokens,
            block_hashes=list(match.hashes),
        )

    def _tier_of_cached(self, block: int) -> int:
        tier = self.pool.tier_of(block)
        return TIER_WORKING_AGENT if tier is None else tier


def tier_of(seq: Sequence, match: PrefixMatch) -> int:
    """The eviction tier of a request's blocks: an agent's — named, or a conversation without a
    name, known by its prompt extending a history whole — or a one-off's."""
    continues = seq.request.agent_id is not None or match.extends_history
    return TIER_WORKING_AGENT if continues else TIER_ONE_OFF
