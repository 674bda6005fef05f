"""The scheduler: which sequences run this step, with how many tokens, in which blocks.

Pure bookkeeping (standard library and the block pool): it hands the runner a plain `Batch`.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from semantic.cache.block_pool import (
    TIER_IDLE_AGENT,
    TIER_ONE_OFF,
    TIER_WORKING_AGENT,
    TOP_TIER,
)
from semantic.cache.prefix import PrefixCache, PrefixMatch
from semantic.core import (
    Batch,
    BatchItem,
    FinishReason,
    History,
    Restore,
    Sequence,
    SequenceStatus,
)

# Tokens a sequence produces after it starts (or resumes) before a newcomer may preempt it:
# bounds how often one sequence can be swapped out.
PREEMPT_QUANTUM = 8


@dataclass(slots=True, frozen=True)
class _Fit:
    """Admitting a sequence now: its prefix match, the eviction tier its blocks get and the
    highest it may reclaim, the fresh blocks it takes, and how many of those it lacks (≤ 0:
    it fits)."""

    match: PrefixMatch
    tier: int
    max_tier: int
    needed: int
    lacking: int


def _work_left(seq: Sequence) -> int:
    return seq.request.sampling.max_tokens - seq.num_output_tokens


class Scheduler:
    """Continuous batching with chunked prefill over a fixed block pool.

    Every step computes, for each running sequence, the tokens that have no KV yet:
    one token for a decoding sequence, a chunk of its prompt for a prefilling one. Decodes go
    first; prefill chunks fill what is left of `max_batch_tokens`, so a long prompt is spread
    over several steps instead of stalling everyone's decoding.

    Admission takes the first waiting sequence once blocks for its whole prompt are available
    (then prefill chunks never need to allocate), keeping one block of headroom per running
    sequence so admitting does not force the next decode to preempt. It reuses the longest
    cached prefix of the prompt (`cache/prefix.py`), wherever it is: pool blocks are shared (a
    partial one copied), and blocks only the disk has are restored into the sequence's fresh
    blocks — the sequence waits RESTORING (holding its blocks, so the restore can never fail for
    room) while the engine reads them, then runs as if they had never left. A restore that
    cannot fit waits in line; it is never recomputed for lack of room.

    A decode that needs a new block and finds none preempts the most recently admitted running
    sequence: its full blocks and its partial last block stay cached (and go to disk if the
    pool reclaims them), and it waits, first in line, to resume from them with the tokens it
    would have had. Full blocks are hashed as soon as they are computed, so concurrent requests
    share them; a finished sequence leaves its partial last block cached too, unless it ended
    in an error (a failed step may have left garbage there).

    Eviction tiers: a sequence's blocks are cached at the working-agent tier when it belongs to
    an agent — named, or a conversation without a name, known by its prompt extending a history
    whole — and at the one-off tier otherwise. A one-off request is admitted only into free
    blocks and cached blocks of one-off requests and idle agents, so a burst of side requests
    never evicts a working agent's cache.

    Invariant: a running or restoring sequence holds blocks for every token of its prompt's
    reused prefix and every token it has computed; a waiting one holds none.
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
        self.restoring: list[Sequence] = []
        self._to_restore: list[Sequence] = []  # admitted this step: their reads are not asked yet
        self._copies: list[tuple[int, int]] = []
        self._copy_sources: list[tuple[int, int]] = []  # (block, tier) held until copied

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.restoring)

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_tokens)

    def add(self, seq: Sequence) -> PrefixMatch:
        """Queue a sequence; the cached blocks of its prompt become the last of their tier (and
        of its own, if higher) to be reclaimed, since they are about to be used. Returns what it
        can reuse as things stand."""
        match = self.prefix.match(seq.token_ids)
        self.prefix.touch(match, self._tier(seq, match))
        self.waiting.append(seq)
        return match

    def schedule(self) -> Batch:
        self._release_copy_sources()
        self._admit_newcomers()
        budget = self.max_batch_tokens
        items: list[BatchItem] = []
        for seq in self._grow_decodes():
            items.append(self._item(seq, 1))
            budget -= 1
        for seq in self.running:
            if budget > 0 and self._pending(seq) > 1:
                items.append(self._prefill_chunk(seq, budget))
                budget -= len(items[-1].token_ids)
        while budget > 0 and (admitted := self._admit_next()) is not None:
            if admitted.status is SequenceStatus.RUNNING:
                items.append(self._prefill_chunk(admitted, budget))
                budget -= len(items[-1].token_ids)
        copies, self._copies = self._copies, []
        return Batch(items, copies)

    def take_restores(self) -> list[Sequence]:
        """The sequences admitted since the last call that wait for blocks from disk: the
        engine reads their `restore` and reports with `restored`."""
        taken, self._to_restore = self._to_restore, []
        return taken

    def restored(self, seq: Sequence, count: int) -> None:
        """The first `count` blocks of `seq.restore` now hold their content. All of them: the
        sequence runs from there. Fewer (a file failed its checks, now quarantined): the blocks
        that did arrive stay cached and the sequence waits, first in line, for a fresh match."""
        restore = seq.restore
        assert restore is not None and seq.status is SequenceStatus.RESTORING
        self.restoring.remove(seq)
        seq.restore = None
        self._index_restored(seq, restore, count)
        if count == len(restore.blocks):
            seq.block_hashes = list(restore.block_hashes)
            seq.num_computed_tokens = restore.num_tokens
            self._start(seq, restore.num_tokens, restore.disk_tokens)
        else:
            self._release(seq)
            seq.status = SequenceStatus.WAITING
            self.waiting.appendleft(seq)

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
        elif seq.status is SequenceStatus.RESTORING:
            self.restoring.remove(seq)
            seq.restore = None  # its blocks are freed: a read that lands later is dropped
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

    def _fit(self, seq: Sequence) -> _Fit:
        """What admitting `seq` now would reuse and take, and how many blocks it lacks."""
        match = self.prefix.match(seq.token_ids)
        tier = seq.cache_tier if seq.first_scheduled_time is not None else self._tier(seq, match)
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
        # Headroom of one block per running sequence, so admitting does not force the next
        # decode step to preempt; a lone request may use the whole pool.
        available = self.pool.num_available(max_tier) - reclaimable_reused - len(self.running)
        return _Fit(match, tier, max_tier, needed, needed - available)

    def _admit_next(self) -> Sequence | None:
        """Admit the first waiting sequence if its prompt fits."""
        if not self.waiting or len(self.running) + len(self.restoring) >= self.max_running:
            return None
        seq = self.waiting[0]
        fit = self._fit(seq)
        if fit.lacking > 0:
            return None
        self.waiting.popleft()
        self._admit(seq, fit)
        return seq

    def _admit(self, seq: Sequence, fit: _Fit) -> None:
        """Share what the pool has, allocate the rest, and plan the restore of what only the
        disk has."""
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
        if seq.first_scheduled_time is None:
            seq.first_scheduled_time = time.monotonic()
            seq.cache_tier = fit.tier
        if not seq.started:
            seq.missing_hash = match.missing
        restore = self._restore_plan(seq, match)
        if restore is None:
            seq.block_hashes = list(match.hashes)
            seq.num_computed_tokens = match.num_tokens
            self._start(seq, match.num_tokens, 0)
        else:
            seq.restore = restore
            seq.status = SequenceStatus.RESTORING
            self.restoring.append(seq)
            self._to_restore.append(seq)

    def _admit_newcomers(self) -> None:
        """Time to first token first: while the line is stuck for room, requests that have not
        produced a token yet go ahead of it, each taking the place of running sequences that
        have had their quantum (`PREEMPT_QUANTUM` tokens since they last started) when it must,
        those with the most left to do first. The preempted keep everything they computed
        cached, and resume from it first in line. Nothing is preempted unless that makes enough
        room for the newcomer."""
        while self.waiting and self._fit(self.waiting[0]).lacking > 0:
            if len(self.running) + len(self.restoring) >= self.max_running:
                return
            newcomer = next((seq for seq in self.waiting if not seq.started), None)
            if newcomer is None:
                return
            fit = self._fit(newcomer)
            if fit.lacking > 0:
                if not self._preempt_for(fit):
                    return
                fit = self._fit(newcomer)
            self.waiting.remove(newcomer)
            self._admit(newcomer, fit)

    def _preempt_for(self, fit: _Fit) -> bool:
        """Preempt running sequences until `fit` would fit; False (preempting none) when all
        that may be preempted would not make room enough."""
        victims, room = [], 0
        for seq in sorted(self._preemptible(), key=_work_left, reverse=True):
            if room >= fit.lacking:
                break
            victims.append(seq)
            room += self._freed_by(seq, fit.max_tier) + 1  # + its headroom block
        if room < fit.lacking:
            return False
        for seq in victims:
            self._preempt(seq)
        return True

    def _preemptible(self) -> list[Sequence]:
        return [
            seq
            for seq in self.running
            if seq.num_output_tokens - seq.outputs_at_start >= PREEMPT_QUANTUM
        ]

    def _freed_by(self, seq: Sequence, max_tier: int) -> int:
        """Blocks preempting `seq` would make available to an admission limited to `max_tier`:
        those only it holds, when it caches at that tier or below."""
        if seq.cache_tier > max_tier:
            return 0
        return sum(1 for block in seq.block_ids if self.pool.refcount(block) == 1)

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

    def _index_restored(self, seq: Sequence, restore: Restore, count: int) -> None:
        """Index the full blocks that arrived, so others share them as they share computed ones."""
        size = self.block_tokens
        arrived = zip(restore.blocks[:count], restore.hashes, restore.indexes, strict=False)
        for block, block_hash, index in arrived:
            if index < len(restore.block_hashes):
                parent = restore.block_hashes[index - 1] if index else self.prefix.root
                tokens = seq.token_ids[index * size : (index + 1) * size]
                self.prefix.insert(block, block_hash, parent, tokens)

    def _start(self, seq: Sequence, cached_tokens: int, disk_tokens: int) -> None:
        """Run a sequence; the first time, its prompt's reused tokens are what its usage says
        came from the cache (a resume after preemption reuses what it computed itself)."""
        if not seq.started:
            seq.started = True
            seq.num_cached_tokens, seq.num_disk_tokens = cached_tokens, disk_tokens
        seq.outputs_at_start = seq.num_output_tokens
        seq.status = SequenceStatus.RUNNING
        self.running.append(seq)

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
    def _tier(seq: Sequence, match: PrefixMatch) -> int:
        """The eviction tier of a request's blocks: an agent's, or a one-off's."""
        continues = seq.request.agent_id is not None or match.extends_history
        return TIER_WORKING_AGENT if continues else TIER_ONE_OFF

    def _preempt(self, seq: Sequence) -> None:
        """Take a running sequence out, keeping everything it computed cached (its partial last
        block too), so it resumes from the cache — memory, or disk if the pool needs the room."""
        self.running.remove(seq)
        self._cache_tail(seq)
        self._release(seq)
        seq.num_computed_tokens = 0
        seq.status = SequenceStatus.WAITING
        self.waiting.appendleft(seq)

    def _release(self, seq: Sequence) -> None:
        self.pool.release(seq.block_ids, seq.cache_tier)
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
