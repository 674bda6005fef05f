"""The pages each sequence holds: what admitting it would reuse and take, its block tables (one
per layer group: shared pool pages, copies, fresh pages, pages to restore from disk), giving
back the pages a sliding window has left, hashing blocks as they fill, caching its partial last
block, and giving everything back.

Standard library and the block pool only; the scheduler decides when, this file decides which
pages.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from semantic.cache.pages.block_pool import (
    TIER_IDLE_AGENT,
    TIER_ONE_OFF,
    TIER_OUT_OF_WINDOW,
    TIER_WORKING_AGENT,
    TOP_TIER,
)
from semantic.cache.pages.prefix import PrefixCache, PrefixMatch, page_key
from semantic.core import BlockTable, Restore, Sequence, first_read_block

# How long a one-off request leaves agents' cached pages alone. After that it may take them like
# any request (they go to disk first): the server never idles while a one-off waits for a cache
# no one is using, and agents' turns that keep coming never keep it waiting until its timeout.
ONE_OFF_PATIENCE_S = 1.0


@dataclass(slots=True, frozen=True)
class Fit:
    """Admitting a sequence now: its prefix match, the eviction tier its pages get and the
    highest it may reclaim, the block each group's table ends before (`ends`), the fresh pages
    it takes, and how many of those it lacks (≤ 0: it fits)."""

    match: PrefixMatch
    tier: int
    max_tier: int
    ends: list[int]
    needed: int
    lacking: int

    @property
    def kept_from_agents(self) -> bool:
        """A one-off that may not reclaim agents' pages: its wait for room is not theirs."""
        return self.max_tier < TOP_TIER


class BlockManager:
    """Allocates, shares, copies and releases a sequence's pages over the pool and its prefix
    index. A reused partial block is copied into the sequence's own pages by the next step
    (`take_copies`); its sources are held until that step has run.

    A full-attention group's table covers the whole prompt from admission on. A sliding group's
    table covers only what the group reads: at admission the window and the first chunk (at
    most `max_chunk_tokens`), then `grow` gives back each page the window has left (`drop`)
    and takes one for each new block, so a sliding group holds a window's worth of pages
    however long the sequence grows.

    Invariant: the pages in a sequence's `block_tables` hold one reference each, released
    exactly once.
    """

    def __init__(
        self,
        prefix: PrefixCache,
        block_tokens: int,
        max_chunk_tokens: int,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.prefix = prefix
        # the clock of requests' `arrival_time` (by default `time.monotonic`, looked up at each
        # call: a test may stand in for `time`)
        self.clock = clock or (lambda: time.monotonic())
        self.pool = prefix.pool
        self.block_tokens = block_tokens
        self.windows = prefix.windows
        self._sliding = [(g, w) for g, w in enumerate(self.windows) if w is not None]
        # The most blocks a sliding group reads at once: a chunk's and the window before it.
        self._spans = [
            None if w is None else -(-(w - 1 + max_chunk_tokens) // block_tokens) + 1
            for w in self.windows
        ]
        self._copies: list[tuple[int, int]] = []
        self._copy_sources: list[tuple[int, int]] = []  # (page, tier) held until copied

    @property
    def pages_per_block(self) -> int:
        """Pages a new block takes: one per layer group."""
        return len(self.windows)

    def root(self, seq: Sequence) -> int:
        """The root of the hash chain of `seq`'s blocks: its owner's."""
        return self.prefix.root_of(seq.request.owner)

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_tokens)

    def max_tokens(self, num_pages: int) -> int | None:
        """The longest sequence a pool of `num_pages` pages holds on its own; None when no group
        reads every block (its sliding groups recycle a window's worth of pages)."""
        spare = num_pages - sum(span for span in self._spans if span is not None)
        full = sum(window is None for window in self.windows)
        if spare < full:
            return 0
        return spare // full * self.block_tokens if full else None

    def fit(self, seq: Sequence, headroom: int) -> Fit:
        """What admitting `seq` now would reuse and take, and how many pages it lacks, keeping
        room for `headroom` blocks of others (one per running sequence, so admitting does not
        force the next decode step to preempt)."""
        match = self.prefix.match(seq.token_ids, self.root(seq))
        tier = seq.cache_tier if seq.first_scheduled_time is not None else tier_of(seq, match)
        # A one-off may not reclaim agents' pages — unless it was preempted (finishing what was
        # started beats keeping a cache), or it has waited `ONE_OFF_PATIENCE_S`.
        patient = self.clock() - seq.request.arrival_time < ONE_OFF_PATIENCE_S
        one_off = tier == TIER_ONE_OFF and not seq.started and patient
        max_tier = TIER_IDLE_AGENT if one_off else TOP_TIER
        # Cached pages we are about to reuse cannot also be reclaimed for the rest (a held
        # page has no tier and was never counted as available).
        reclaimable_reused = sum(
            1 for p in match.in_memory if (t := self.pool.tier_of(p)) is not None and t <= max_tier
        )
        blocks = self.blocks_for(len(seq.token_ids))
        ends = [
            blocks if span is None else min(blocks, first + span)
            for first, span in zip(match.first, self._spans, strict=True)
        ]
        covered = sum(end - first for end, first in zip(ends, match.first, strict=True))
        needed = covered - match.num_shared
        available = (
            self.pool.num_available(max_tier) - reclaimable_reused - headroom * self.pages_per_block
        )
        return Fit(match, tier, max_tier, ends, needed, needed - available)

    def admit(self, seq: Sequence, fit: Fit) -> Restore | None:
        """Give `seq` its block tables: the pool pages it reuses (shared; a partial block's
        copied into fresh pages), fresh pages for the rest. Returns the restore of the pages
        only the disk has (into their fresh pages), or None when the pool had everything."""
        match = fit.match
        tail_index = len(match.hashes)
        for index, _, page in match.entries():
            if page is not None and index == tail_index:
                self._copy_sources.append((page, self._tier_of_cached(page)))
        for page in match.in_memory:
            self.pool.acquire(page)
        fresh = iter(self.pool.allocate(fit.needed, fit.max_tier))
        seq.block_tables = [BlockTable(first, []) for first in match.first]
        for group, reused in enumerate(match.pages):
            table = seq.block_tables[group]
            for page in reused:
                if page is not None and table.end < tail_index:  # a full block's: shared
                    table.pages.append(page)
                    continue
                table.pages.append(next(fresh))
                if page is not None:  # the tail's: copied
                    self._copies.append((page, table.pages[-1]))
            table.pages += [next(fresh) for _ in range(fit.ends[group] - table.end)]
        return self._restore_plan(seq, match)

    def take_copies(self) -> list[tuple[int, int]]:
        """The page copies the next step must make first; their sources are released after."""
        copies, self._copies = self._copies, []
        return copies

    def release_copy_sources(self) -> None:
        """Copy sources are held until the step that copies them has run."""
        for page, tier in self._copy_sources:
            self.pool.release([page], tier)
        self._copy_sources = []

    def grow(self, seq: Sequence, num_tokens: int) -> bool:
        """Pages in every group for the blocks of the first `num_tokens` tokens that the next
        step computes, once each sliding group has given back the pages its window has left;
        False (taking none) when the pool has too few. A running sequence may reclaim any
        cached page: finishing what was started beats keeping a cache (the tier limit applies
        to admission only)."""
        if self._sliding:
            self._drop_passed(seq)
        blocks = self.blocks_for(num_tokens)
        short = [t for t in seq.block_tables if t.first + len(t.pages) < blocks]
        if not short:
            return True
        count = sum(blocks - table.end for table in short)
        if count > self.pool.num_available():
            return False
        fresh = iter(self.pool.allocate(count))
        for table in short:
            table.pages += [next(fresh) for _ in range(blocks - table.end)]
        return True

    def _drop_passed(self, seq: Sequence) -> None:
        """Give back each sliding group's pages of the blocks its window has left: cached out
        of the window (reclaimed first, never saved to disk) unless someone else holds them.
        Those its prompt reused keep its tier until its answer is done: they are the window of
        the history it continues, which a client that stops the answer sends again
        (`let_go_of_reused_window`)."""
        if not seq.block_tables:  # waiting: it holds nothing
            return
        reused = seq.num_cached_tokens // self.block_tokens  # full blocks taken from the cache
        for group, window in self._sliding:
            table = seq.block_tables[group]
            first = first_read_block(window, seq.num_computed_tokens, self.block_tokens)
            passed = min(first, table.end) - table.first
            if passed > 0:
                kept = min(passed, max(0, reused - table.first))
                self.pool.release(table.pages[:kept], seq.cache_tier)
                self.pool.drop(table.pages[kept:passed])
                del table.pages[:passed]
                table.first += passed

    def let_go_of_reused_window(self, seq: Sequence, named: Callable[[int], bool]) -> None:
        """Once `seq`'s answer is done: the sliding pages of the window its prompt reused (the
        history it continued), kept at its tier while it ran (`_drop_passed`), go out of the
        window like any other page it passed, but those its own window still reads and those
        of blocks an agent's history `named` (whose windows the agents let go of, knowing which
        another agent, a fork, still reads)."""
        if not self._sliding:
            return
        reused, size = seq.num_cached_tokens, self.block_tokens
        hashes = self.prefix.chain(seq.token_ids[: reused - reused % size], self.root(seq))
        for group, window in self._sliding:
            start = first_read_block(window, reused, size)
            end = min(len(hashes), first_read_block(window, seq.num_computed_tokens, size))
            for block_hash in hashes[start:end]:
                page = None if named(block_hash) else self.pool.lookup(page_key(block_hash, group))
                if page is not None:
                    self.pool.retier(page, TIER_OUT_OF_WINDOW)  # only a cached page moves

    def index_restored(self, seq: Sequence, restore: Restore, count: int) -> None:
        """Index the full blocks' pages of `restore` that arrived (its first `count`), so others
        share them as they share computed ones."""
        size = self.block_tokens
        arrived = zip(restore.pages[:count], restore.keys, restore.indexes, strict=False)
        for page, key, index in arrived:
            if index < len(restore.block_hashes):
                parent = restore.block_hashes[index - 1] if index else self.root(seq)
                tokens = seq.token_ids[index * size : (index + 1) * size]
                self.prefix.insert(page, key, parent, tokens)

    def hash_full_blocks(self, seq: Sequence) -> None:
        """Index the blocks that just filled up: from now on other requests can share them."""
        size = self.block_tokens
        while (len(seq.block_hashes) + 1) * size <= seq.num_computed_tokens:
            index = len(seq.block_hashes)
            parent = seq.block_hashes[-1] if seq.block_hashes else self.root(seq)
            tokens = seq.token_ids[index * size : (index + 1) * size]
            pages = [table.page(index) for table in seq.block_tables]
            seq.block_hashes.append(self.prefix.register(pages, parent, tokens))

    def cache_tail(self, seq: Sequence) -> int | None:
        """Index the partial last block, so the next turn of this history reuses it (a history
        that ends on a block boundary is marked as ending there instead)."""
        full = len(seq.block_hashes)
        start = full * self.block_tokens
        if seq.num_computed_tokens == start and full:
            self.prefix.end_history(seq.block_hashes[-1])  # it ends on a block boundary
        if seq.num_computed_tokens <= start or any(t.end <= full for t in seq.block_tables):
            return None
        parent = seq.block_hashes[-1] if full else self.root(seq)
        tokens = seq.token_ids[start : seq.num_computed_tokens]
        pages = [table.page(full) for table in seq.block_tables]
        return self.prefix.register(pages, parent, tokens)

    def release(self, seq: Sequence) -> None:
        """Give back every page of `seq`; hashed ones stay cached at its tier, but those its
        windows have left since its last step (`grow`) out of the window."""
        self._drop_passed(seq)
        self._index_orphans(seq)
        for table in seq.block_tables:
            self.pool.release(table.pages, seq.cache_tier)
        seq.block_tables = []
        seq.block_hashes = []

    def _index_orphans(self, seq: Sequence) -> None:
        """A page computed while another page held the same content was left unindexed
        (`PrefixCache.register`). When that other page has gone since (its agent was deleted,
        which discards what no agent names), this one takes its place: the history the
        sequence leaves must name blocks that exist."""
        size = self.block_tokens
        for index, block_hash in enumerate(seq.block_hashes):
            parent = seq.block_hashes[index - 1] if index else self.root(seq)
            tokens = seq.token_ids[index * size : (index + 1) * size]
            for group, table in enumerate(seq.block_tables):
                if table.first <= index < table.end:
                    page = table.page(index)
                    if self.pool.hash_of(page) is None:
                        self.prefix.insert(page, page_key(block_hash, group), parent, tokens)

    def _restore_plan(self, seq: Sequence, match: PrefixMatch) -> Restore | None:
        below = [(i, g) for i, g, page in match.entries() if page is None]
        if not below:
            return None
        tail_index = len(match.hashes)
        blocks = {i for i, _ in below}
        tail_tokens = match.tail_tokens if tail_index in blocks else 0
        return Restore(
            pages=[seq.block_tables[g].page(i) for i, g in below],
            keys=[match.key(i, g) for i, g in below],
            indexes=[i for i, _ in below],
            tail_tokens=tail_tokens,
            num_tokens=match.num_tokens,
            disk_tokens=len(blocks - {tail_index}) * self.block_tokens + tail_tokens,
            block_hashes=list(match.hashes),
        )

    def _tier_of_cached(self, page: int) -> int:
        tier = self.pool.tier_of(page)
        return TIER_WORKING_AGENT if tier is None else tier


def tier_of(seq: Sequence, match: PrefixMatch) -> int:
    """The eviction tier of a request's pages: an agent's — named, or a conversation without a
    name, known by its prompt extending a history whole — or a one-off's."""
    continues = seq.request.agent_id is not None or match.extends_history
    return TIER_WORKING_AGENT if continues else TIER_ONE_OFF
