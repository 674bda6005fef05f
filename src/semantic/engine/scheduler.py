"""The scheduler: which sequences run this step, with how many tokens, in which blocks.

Pure bookkeeping (standard library and the block pool): it hands the runner a plain `Batch`.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable

from semantic.cache.block_pool import (
    TIER_IDLE_AGENT,
    TIER_ONE_OFF,
    TIER_WORKING_AGENT,
    TOP_TIER,
)
from semantic.cache.prefix import PrefixCache
from semantic.core import (
    Batch,
    BatchItem,
    FinishReason,
    History,
    Request,
    Sequence,
    SequenceStatus,
)


class Scheduler:
    """Continuous batching with chunked prefill over a fixed block pool.

    Every step computes, for each running sequence, the tokens that have no KV yet:
    one token for a decoding sequence, a chunk of its prompt for a prefilling one. Decodes go
    first; prefill chunks fill what is left of `max_batch_tokens`, so a long prompt is spread
    over several steps instead of stalling everyone's decoding.

    Admission first reuses the longest cached prefix of the prompt (`cache/prefix.py`): whole
    blocks are shared, a partial block is copied. It takes a waiting sequence only when blocks
    for the rest of its prompt are available (then prefill chunks never need to allocate). A
    decode that needs a new block and finds none preempts the most recently admitted sequence:
    its blocks are released (their full blocks stay cached) and it waits, first in line, to be
    recomputed. Full blocks are hashed as soon as they are computed, so concurrent requests
    share them; a finished sequence leaves its partial last block cached too, unless it ended
    in an error (a failed step may have left garbage there).

    A request with no agent is admitted only into free blocks and cached blocks of one-off
    requests and idle agents, so a burst of side requests never evicts a working agent's cache.

    Invariant: a running sequence holds blocks for every token it has computed; a waiting one
    holds none.
    """

    def __init__(
        self,
        prefix: PrefixCache,
        *,
        block_tokens: int,
        max_running: int,
        max_batch_tokens: int,
        end_token_ids: Iterable[int] = (),
    ) -> None:
        self.prefix = prefix
        self.pool = prefix.pool
        self.block_tokens = block_tokens
        self.max_running = max_running
        self.max_batch_tokens = max_batch_tokens
        self.end_token_ids = tuple(end_token_ids)
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self._copies: list[tuple[int, int]] = []
        self._copy_sources: list[tuple[int, int]] = []  # (block, tier) held until copied

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_tokens)

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def schedule(self) -> Batch:
        self._release_copy_sources()
        budget = self.max_batch_tokens
        items: list[BatchItem] = []
        for seq in self._grow_decodes():
            items.append(self._item(seq, 1))
            budget -= 1
        for seq in self.running:
            if budget > 0 and self._pending(seq) > 1:
                items.append(self._prefill_chunk(seq, budget))
                budget -= len(items[-1].token_ids)
        while budget > 0 and self._admit_next():
            items.append(self._prefill_chunk(self.running[-1], budget))
            budget -= len(items[-1].token_ids)
        copies, self._copies = self._copies, []
        return Batch(items, copies)

    def update(self, batch: Batch, tokens: list[int | None]) -> list[tuple[Sequence, int]]:
        """Record a finished step: mark its tokens computed and append the sampled ones.
        Returns (sequence, new token) for every sequence that got one."""
        by_id = {seq.seq_id: seq for seq in self.running}
        sampled: list[tuple[Sequence, int]] = []
        for item, token in zip(batch.items, tokens, strict=True):
            seq = by_id.get(item.seq_id)
            if seq is None:  # aborted while the step ran
                continue
            seq.num_computed_tokens += len(item.token_ids)
            self._hash_full_blocks(seq)
            if token is not None:
                seq.token_ids.append(token)
                sampled.append((seq, token))
        return sampled

    def finish(self, seq: Sequence, reason: FinishReason) -> History:
        """End a sequence wherever it is; its blocks go back to the pool, its content stays
        cached. Returns what it left cached."""
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
        elif seq.status is SequenceStatus.WAITING:
            self.waiting.remove(seq)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
        # A failed step may have left garbage in the partial block: only full blocks are kept.
        tail = None if reason is FinishReason.ERROR else self._cache_tail(seq)
        history = History(list(seq.block_hashes), tail, seq.num_computed_tokens)
        self._release(seq)
        return history

    def expired(self, timeout_s: float, now: float | None = None) -> list[Sequence]:
        """Waiting sequences never admitted within `timeout_s` of arrival."""
        now = time.monotonic() if now is None else now
        return [
            seq
            for seq in self.waiting
            if seq.first_scheduled_time is None and now - seq.request.arrival_time > timeout_s
        ]

    def _pending(self, seq: Sequence) -> int:
        return len(seq.token_ids) - seq.num_computed_tokens

    def _grow_decodes(self) -> list[Sequence]:
        """Running sequences with exactly one token to compute, each given room for it;
        preempts the newest sequences when the pool runs dry."""
        decodes = []
        for seq in list(self.running):
            if seq.status is not SequenceStatus.RUNNING or self._pending(seq) != 1:
                continue
            while self.blocks_for(len(seq.token_ids)) > len(seq.block_ids):
                # A running sequence may reclaim any cached block: finishing what was started
                # beats keeping a cache (the tier limit applies to admission only).
                if self.pool.num_available():
                    seq.block_ids += self.pool.allocate(1)
                else:
                    self._preempt(self.running[-1])
                    if seq.status is not SequenceStatus.RUNNING:
                        break
            if seq.status is SequenceStatus.RUNNING:
                decodes.append(seq)
        return decodes

    def _admit_next(self) -> bool:
        if not self.waiting or len(self.running) >= self.max_running:
            return False
        seq = self.waiting[0]
        match = self.prefix.match(seq.token_ids)
        max_tier = self.max_tier(seq.request)
        reused = [*match.block_ids, *([match.tail_source] if match.tail_source is not None else [])]
        # Cached blocks we are about to reuse cannot also be reclaimed for the rest (a held
        # block has no tier and was never counted as available).
        reclaimable_reused = sum(
            1 for b in reused if (tier := self.pool.tier_of(b)) is not None and tier <= max_tier
        )
        needed = self.blocks_for(len(seq.token_ids)) - len(match.block_ids)
        # Headroom of one block per running sequence, so admitting does not force the next
        # decode step to preempt; a lone request may use the whole pool.
        available = self.pool.num_available(max_tier) - reclaimable_reused - len(self.running)
        if needed > available:
            return False
        self.waiting.popleft()
        if match.tail_source is not None:
            self._copy_sources.append((match.tail_source, self._tier_of_cached(match.tail_source)))
        for block in reused:
            self.pool.acquire(block)
        fresh = self.pool.allocate(needed, max_tier)
        if match.tail_source is not None:
            self._copies.append((match.tail_source, fresh[0]))
        seq.block_ids = [*match.block_ids, *fresh]
        seq.block_hashes = list(match.block_hashes)
        seq.num_computed_tokens = match.num_tokens
        if seq.first_scheduled_time is None:
            seq.first_scheduled_time = time.monotonic()
            seq.num_cached_tokens = match.num_tokens
        seq.status = SequenceStatus.RUNNING
        self.running.append(seq)
        return True

    def _tier_of_cached(self, block: int) -> int:
        tier = self.pool.tier_of(block)
        return TIER_WORKING_AGENT if tier is None else tier

    def _release_copy_sources(self) -> None:
        """Copy sources are held until the step that copies them has run."""
        for block, tier in self._copy_sources:
            self.pool.release([block], tier)
        self._copy_sources = []

    def _hash_full_blocks(self, seq: Sequence) -> None:
        size = self.block_tokens
        while (len(seq.block_hashes) + 1) * size <= seq.num_computed_tokens:
            index = len(seq.block_hashes)
            parent = seq.block_hashes[-1] if seq.block_hashes else self.prefix.root
            tokens = seq.token_ids[index * size : (index + 1) * size]
            seq.block_hashes.append(self.prefix.register(seq.block_ids[index], parent, tokens))

    def _cache_tail(self, seq: Sequence) -> int | None:
        """Index the partial last block, so the next turn of this history reuses it."""
        full = len(seq.block_hashes)
        start = full * self.block_tokens
        if seq.num_computed_tokens <= start or len(seq.block_ids) <= full:
            return None
        parent = seq.block_hashes[-1] if full else self.prefix.root
        tokens = seq.token_ids[start : seq.num_computed_tokens]
        return self.prefix.register(seq.block_ids[full], parent, tokens)

    @staticmethod
    def max_tier(request: Request) -> int:
        """The highest eviction tier a request's admission may reclaim."""
        return TIER_IDLE_AGENT if request.agent_id is None else TOP_TIER

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self._release(seq)
        seq.num_computed_tokens = 0
        seq.status = SequenceStatus.WAITING
        self.waiting.appendleft(seq)

    def _release(self, seq: Sequence) -> None:
        tier = TIER_ONE_OFF if seq.request.agent_id is None else TIER_WORKING_AGENT
        self.pool.release(seq.block_ids, tier)
        seq.block_ids = []
        seq.block_hashes = []

    def _prefill_chunk(self, seq: Sequence, budget: int) -> BatchItem:
        return self._item(seq, min(self._pending(seq), budget))

    def _item(self, seq: Sequence, count: int) -> BatchItem:
        start = seq.num_computed_tokens
        sample = start + count == len(seq.token_ids)
        sampling = seq.request.sampling
        held_back = sample and seq.num_output_tokens < sampling.min_tokens
        return BatchItem(
            seq_id=seq.seq_id,
            token_ids=seq.token_ids[start : start + count],
            start_pos=start,
            block_table=list(seq.block_ids),
            sample=sample,
            sampling=sampling,
            num_output_tokens=seq.num_output_tokens,
            suppress_token_ids=self._end_tokens(seq) if held_back else (),
        )

    def _end_tokens(self, seq: Sequence) -> tuple[int, ...]:
        return self.end_token_ids + seq.request.sampling.stop_token_ids
