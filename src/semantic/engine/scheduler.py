"""The scheduler: which sequences run this step, with how many tokens, in which blocks.

Pure bookkeeping (standard library and the block pool): it hands the runner a plain `Batch`.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable

from semantic.cache.block_pool import BlockPool
from semantic.core import Batch, BatchItem, FinishReason, Sequence, SequenceStatus


class Scheduler:
    """Continuous batching with chunked prefill over a fixed block pool.

    Every step computes, for each running sequence, the tokens that have no KV yet:
    one token for a decoding sequence, a chunk of its prompt for a prefilling one. Decodes go
    first; prefill chunks fill what is left of `max_batch_tokens`, so a long prompt is spread
    over several steps instead of stalling everyone's decoding.

    Admission takes a waiting sequence only when blocks for its whole prompt are free (then
    prefill chunks never need to allocate). A decode that needs a new block and finds none
    preempts the most recently admitted sequence: its blocks are released and it waits, first in
    line, to be recomputed. Invariant: a running sequence holds blocks for every token it has
    computed; a waiting one holds none.
    """

    def __init__(
        self,
        pool: BlockPool,
        *,
        block_tokens: int,
        max_running: int,
        max_batch_tokens: int,
        end_token_ids: Iterable[int] = (),
    ) -> None:
        self.pool = pool
        self.block_tokens = block_tokens
        self.max_running = max_running
        self.max_batch_tokens = max_batch_tokens
        self.end_token_ids = tuple(end_token_ids)
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_tokens)

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def schedule(self) -> Batch:
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
        return Batch(items)

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
            if token is not None:
                seq.token_ids.append(token)
                sampled.append((seq, token))
        return sampled

    def finish(self, seq: Sequence, reason: FinishReason) -> None:
        """End a sequence wherever it is; its blocks go back to the pool."""
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
        elif seq.status is SequenceStatus.WAITING:
            self.waiting.remove(seq)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
        self._release(seq)

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
                if self.pool.num_available:
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
        needed = self.blocks_for(len(seq.token_ids))
        # Headroom of one block per running sequence, so admitting does not force the next
        # decode step to preempt; a lone request may use the whole pool.
        headroom = len(self.running)
        if needed + headroom > self.pool.num_available:
            return False
        self.waiting.popleft()
        seq.block_ids = self.pool.allocate(needed)
        seq.status = SequenceStatus.RUNNING
        if seq.first_scheduled_time is None:
            seq.first_scheduled_time = time.monotonic()
        self.running.append(seq)
        return True

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self._release(seq)
        seq.num_computed_tokens = 0
        seq.status = SequenceStatus.WAITING
        self.waiting.appendleft(seq)

    def _release(self, seq: Sequence) -> None:
        self.pool.release(seq.block_ids)
        seq.block_ids = []

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
