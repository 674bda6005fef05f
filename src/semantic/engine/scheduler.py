"""The scheduler: which sequences run this step, with how many tokens, and which wait.

Pure bookkeeping (standard library and the cache's bookkeeping): it hands the runner a plain
`Batch`. Which blocks a sequence holds is `cache/pages/block_manager.py`'s business.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Iterable

from semantic.cache.pages.block_manager import BlockManager, Fit, tier_of
from semantic.cache.pages.prefix import PrefixCache, PrefixMatch
from semantic.core import (
    Batch,
    BatchItem,
    FinishReason,
    History,
    Sequence,
    SequenceStatus,
    StepToken,
    TokenLogprob,
)
from semantic.engine.drafts import next_limit, propose

# The share of `max_batch_tokens` a step that also decodes may spend on prompts: a decode then
# waits for one such chunk at most (256 tokens at the default 512: ~0.25 s of SmolLM2 on two
# CPU cores, against ~0.5 s for a whole step), while a prompt alone still gets whole steps.
PREFILL_SHARE_WHILE_DECODING = 0.5
# How long requests that fit may go ahead of a request that waits for room (a warm turn's few
# blocks past a cold prompt's many): after that the line waits with it, so a stream of turns
# that fit never starves it. An answer that was preempted is never passed.
PASSED_FOR_S = 5.0
# Shorter prompts go first, but newer ones may overtake a waiting prompt by at most this many
# times its remaining length: then it goes first with half the budget or more, so a stream of
# short prompts never starves it and it never holds them all back.
OVERTAKE_LIMIT = 4
# Speculative decoding drafts only while this few sequences decode: a draft costs a forward pass
# over its tokens whether or not they are accepted, which a lone decode (reading every weight
# for one token) gets almost free, and a busy batch pays for in full.
DRAFT_UP_TO_DECODES = 2


def _waiting_since(seq: Sequence) -> float:
    if seq.first_scheduled_time is None:
        return seq.request.arrival_time
    # Back in line, never preempted, after a restore failed its checks: it is first in line and
    # is never refused for the wait.
    return seq.preempted_at if seq.preempted_at is not None else math.inf


def _passable(seq: Sequence, now: float) -> bool:
    """Whether requests that fit may go ahead of `seq`, which lacks room: never an answer that
    has streamed tokens (preempted when a decode found the pool dry, it resumes first), and a
    request only for its first `PASSED_FOR_S`."""
    return not seq.num_output_tokens and now - seq.request.arrival_time < PASSED_FOR_S


def _monotonic() -> float:
    """`time.monotonic()`, looked up at each call (a test may stand in for `time`)."""
    return time.monotonic()


def _no_agent(block_hash: int) -> bool:
    """No agent names any block (a scheduler without an agents store)."""
    return False


def _work_left(seq: Sequence) -> int:
    return seq.request.sampling.max_tokens - seq.num_output_tokens


class Scheduler:
    """Continuous batching with chunked prefill over a fixed block pool.

    Every step computes, for each running sequence, the tokens that have no KV yet:
    one token for a decoding sequence, a chunk of its prompt for a prefilling one. Decodes go
    first; prompt chunks fill what is left of `max_batch_tokens`, and no more than its
    `PREFILL_SHARE_WHILE_DECODING` while anyone decodes, so a long prompt is spread over several
    steps and holds each decode up by one short chunk. The prompt with the fewest tokens left
    goes first (a warm turn's few new tokens before a cold prompt's thousands; equal ones in the
    order they started), unless newer prompts have overtaken an older one by `OVERTAKE_LIMIT`
    times what it has left: the oldest such goes first, with at least half the prompt budget.
    Why this policy: docs/design.md.

    Admission takes waiting sequences in order (one that lacks room lets those behind it that
    fit pass for its first `PASSED_FOR_S`, never once it has streamed tokens), each once pages
    for its whole prompt are available (then prefill chunks never need room: a sliding layer
    group's pages are reserved for its window and a chunk, and each chunk trades the pages its
    window left for new ones, `cache/pages/block_manager.py`), keeping one block of headroom per
    running sequence so admitting does not force the next decode to preempt. All that fit are
    admitted before the step's chunks are chosen, so a short prompt can go first. Admission
    reuses the longest cached prefix of the prompt (`cache/pages/prefix.py`), wherever it is:
    pool blocks are shared (a partial one copied), and blocks only the disk has are restored
    into the sequence's fresh blocks — the sequence waits RESTORING (holding its blocks, so the
    restore can never fail for room) while the engine reads them, then runs as if they had
    never left. A restore that cannot fit waits in line; it is never recomputed for lack of
    room.

    Nothing is preempted to admit anyone: a newcomer that lacks room waits for it, so an answer
    that has started streaming is never stopped for a newcomer (docs/design.md, "A streaming
    answer keeps its place"). Only a decode that needs a new block and finds none preempts:
    the newest running sequence that has not streamed a token yet, else the newest. Its full
    blocks and its partial last block stay cached (and go to disk if the pool reclaims them),
    and it waits, first in line, to resume from them with the tokens it would have had. Full
    blocks are hashed as soon as they are computed, so concurrent requests share them; a
    finished sequence leaves its partial last block cached too, unless it ended in an error (a
    failed step may have left garbage there).

    Eviction tiers: a sequence's blocks are cached at the working-agent tier when it belongs to
    an agent — named, or a conversation without a name, known by its prompt extending a history
    whole — and at the one-off tier otherwise. A one-off request is admitted only into free
    blocks and cached blocks of one-off requests and idle agents for its first second, so a
    burst of side requests does not evict a working agent's cache; after that it may take them
    (they go to disk first), so agents' turns never keep it waiting
    (`cache/pages/block_manager.py`).

    Speculative decoding (`speculative_tokens` > 0): while at most `DRAFT_UP_TO_DECODES`
    sequences decode, each one past its min_tokens gets a draft from its own context
    (`engine/drafts.py`) appended to its decode token, with pages for the draft's positions
    when the pool has them (else no draft: a draft never preempts), as long as its drafts have
    earned (`drafts.next_limit`: shorter after a miss). The runner returns the
    draft tokens it accepts and one more; `update` counts K/V only for what was accepted, so a
    rejected token's K/V is never hashed or cached, and is overwritten by a later step.

    Invariant: a running or restoring sequence holds pages for every token of its prompt's
    reused prefix and every token it has computed that its layer groups still read; a waiting
    one holds none.
    """

    def __init__(
        self,
        prefix: PrefixCache,
        *,
        block_tokens: int,
        max_running: int,
        max_batch_tokens: int,
        end_token_ids: Iterable[int] = (),
        named: Callable[[int], bool] = _no_agent,
        speculative_tokens: int = 0,
        context_tokens: int | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.prefix = prefix
        # Seconds on the clock that requests' `arrival_time` is on (a virtual one in tests and
        # simulations).
        self.clock = clock or _monotonic
        # Whether an agent's history names a block: the agents store then keeps its pages as its
        # windows need (`finish`).
        self.named = named
        self.pool = prefix.pool
        # on the scheduler's clock, whatever it is set to later
        self.blocks = BlockManager(prefix, block_tokens, max_batch_tokens, lambda: self.clock())
        self.max_running = max_running
        self.max_batch_tokens = max_batch_tokens
        self.end_token_ids = tuple(end_token_ids)
        self.speculative_tokens = speculative_tokens  # the longest draft (0: none)
        # The most tokens a sequence may have: a draft never reaches past it.
        pool_tokens = self.blocks.max_tokens(self.pool.num_blocks)
        limits = [n for n in (context_tokens, pool_tokens) if n is not None]
        self.max_seq_tokens = min(limits, default=None)
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.restoring: list[Sequence] = []
        self._to_restore: list[Sequence] = []  # admitted this step: their reads are not asked yet
        # Prompt tokens newer sequences computed while each running prompt got none (seq ids
        # are given in order of arrival).
        self._overtaken: dict[int, int] = {}
        self.preemptions = 0  # since start

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.restoring)

    def add(self, seq: Sequence) -> PrefixMatch:
        """Queue a sequence; the cached blocks of its prompt become the last of their tier (and
        of its own, if higher) to be reclaimed, since they are about to be used. Returns what it
        can reuse as things stand."""
        match = self.prefix.match(seq.token_ids, self.blocks.root(seq))
        self.prefix.touch(match, tier_of(seq, match))
        self.waiting.append(seq)
        return match

    def schedule(self) -> Batch:
        self.blocks.release_copy_sources()
        while self._admit_next() is not None:
            pass
        decoding = self._grow_decodes()
        drafts = self._drafts(decoding)
        decodes = [self._item(seq, 1, drafts.get(seq.seq_id, [])) for seq in decoding]
        chunks = self._prefill_chunks(self._prefill_budget(sum(len(i.token_ids) for i in decodes)))
        return Batch(decodes + chunks, self.blocks.take_copies())

    def blocked_by_held_pages(self) -> bool:
        """Nothing runs or restores, and the first in line lacks pages though it may take any
        cached one: only pages held outside the scheduler (pins) stand in its way."""
        if self.running or self.restoring or not self.waiting:
            return False
        fit = self._fit(self.waiting[0])
        return fit.lacking > 0 and not fit.kept_from_agents

    def take_restores(self) -> list[Sequence]:
        """The sequences admitted since the last call that wait for blocks from disk: the
        engine reads their `restore` and reports with `restored`."""
        taken, self._to_restore = self._to_restore, []
        return taken

    def restored(self, seq: Sequence, count: int) -> None:
        """The first `count` pages of `seq.restore` now hold their content. All of them: the
        sequence runs from there. Fewer (a file failed its checks, now quarantined): the pages
        that did arrive stay cached and the sequence waits, first in line, for a fresh match."""
        restore = seq.restore
        assert restore is not None and seq.status is SequenceStatus.RESTORING
        self.restoring.remove(seq)
        seq.restore = None
        self.blocks.index_restored(seq, restore, count)
        if count == len(restore.pages):
            seq.block_hashes = list(restore.block_hashes)
            seq.num_computed_tokens = restore.num_tokens
            self._start(seq, restore.num_tokens, restore.disk_tokens)
        else:
            self.blocks.release(seq)
            seq.status = SequenceStatus.WAITING
            self.waiting.appendleft(seq)

    def update(self, batch: Batch, tokens: Iterable[StepToken]) -> list[tuple[Sequence, list[int]]]:
        """Record a finished step: mark its tokens computed and append the first sampled token of
        each item. Returns (sequence, its new tokens) for every sequence that got some: one
        token, or a verified draft's accepted tokens and the one after them, whose second and
        later tokens the caller appends with `accept`, one by one, so that a stop inside the
        run (an end token, a stop string, max_tokens) leaves nothing after it recorded."""
        by_id = {seq.seq_id: seq for seq in self.running}
        sampled: list[tuple[Sequence, list[int]]] = []
        for item, token in zip(batch.items, tokens, strict=True):
            seq = by_id.get(item.seq_id)
            if seq is None:  # aborted while the step ran
                continue
            # A draft's K/V counts once its tokens are accepted (`accept`).
            seq.num_computed_tokens += len(item.token_ids) - len(item.draft_token_ids)
            self.blocks.hash_full_blocks(seq)
            if item.draft_token_ids and isinstance(token, list):
                longest = self.speculative_tokens
                limit, drafted = seq.draft_limit or longest, len(item.draft_token_ids)
                seq.draft_limit = next_limit(limit, drafted, len(token) - 1, longest)
            if token is not None:
                run = token if isinstance(token, list) else [_token_id(token)]
                seq.token_ids.append(run[0])
                sampled.append((seq, run))
        return sampled

    def accept(self, seq: Sequence, token: int) -> None:
        """Append the next token of a verified draft's run (`update`): the token before it, a
        draft token the runner accepted, was computed in the step that verified it."""
        seq.num_computed_tokens = len(seq.token_ids)
        self.blocks.hash_full_blocks(seq)
        seq.token_ids.append(token)

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
        tail = None if reason is FinishReason.ERROR else self.blocks.cache_tail(seq)
        history = History(list(seq.block_hashes), tail, seq.num_computed_tokens)
        self.blocks.release(seq)
        if reason.answered:
            self.blocks.let_go_of_reused_window(seq, self.named)
        return history

    def expired(self, timeout_s: float, now: float | None = None) -> list[Sequence]:
        """Waiting sequences that have waited `timeout_s` for room: never admitted since they
        arrived, or not resumed since they were preempted. Nobody passes them for long
        (`_passable`), so this is the answer of a machine too slow for its load."""
        now = self.clock() if now is None else now
        return [seq for seq in self.waiting if now - _waiting_since(seq) > timeout_s]

    def _pending(self, seq: Sequence) -> int:
        return len(seq.token_ids) - seq.num_computed_tokens

    def _prefill_budget(self, decodes: int) -> int:
        """Prompt tokens this step may compute beside `decodes` decoding sequences."""
        budget = self.max_batch_tokens - decodes
        if decodes:
            budget = min(budget, int(self.max_batch_tokens * PREFILL_SHARE_WHILE_DECODING))
        return max(0, budget)

    def _prefill_chunks(self, budget: int) -> list[BatchItem]:
        """Chunks of the running prompts, fewest tokens left first, until `budget` is spent —
        but the oldest prompt that newer ones have overtaken by `OVERTAKE_LIMIT` times what it
        has left goes first, with at least half the budget: the rest still goes shortest
        first, so a returning agent's few new tokens never wait behind it."""
        prefilling = self._prefill_order()
        chunks: list[BatchItem] = []
        starved = self._starved(prefilling)
        if starved is not None:
            others = [seq for seq in prefilling if seq is not starved]
            behind = min(sum(self._pending(seq) for seq in others), budget // 2)
            budget -= self._add_chunk(chunks, starved, budget - behind)
        for seq in prefilling:
            if budget <= 0:
                break
            if seq is not starved:
                budget -= self._add_chunk(chunks, seq, budget)
        self._count_overtaking(prefilling, chunks)
        return chunks

    def _prefill_order(self) -> list[Sequence]:
        """Running prompts, fewest tokens left first. A stable sort: equals keep the order
        they started in."""
        running = (s for s in self.running if s.status is SequenceStatus.RUNNING)
        return sorted((seq for seq in running if self._pending(seq) > 1), key=self._pending)

    def _starved(self, prefilling: list[Sequence]) -> Sequence | None:
        """The oldest prompt that newer ones have overtaken by `OVERTAKE_LIMIT` times what it
        has left, if any."""
        overtaken = self._overtaken
        starved = (
            seq
            for seq in prefilling
            if overtaken.get(seq.seq_id, 0) >= OVERTAKE_LIMIT * self._pending(seq)
        )
        return min(starved, key=lambda seq: seq.seq_id, default=None)

    def _count_overtaking(self, prefilling: list[Sequence], chunks: list[BatchItem]) -> None:
        """Credit every prompt that got no chunk this step with the tokens newer prompts got
        (forgetting those that left prefill)."""
        served = {item.seq_id: len(item.token_ids) for item in chunks}
        overtaken = {}
        for seq in prefilling:
            passed = 0
            if seq.seq_id not in served:
                passed = sum(n for seq_id, n in served.items() if seq_id > seq.seq_id)
            overtaken[seq.seq_id] = self._overtaken.get(seq.seq_id, 0) + passed
        self._overtaken = overtaken

    def _grow_decodes(self) -> list[Sequence]:
        """Running sequences with exactly one token to compute, each given room for it;
        preempts others when the pool runs dry (`_victim`)."""
        decodes = []
        for seq in list(self.running):
            if seq.status is not SequenceStatus.RUNNING or self._pending(seq) != 1:
                continue
            while not self.blocks.grow(seq, len(seq.token_ids)):
                self._preempt(self._victim())
                if seq.status is not SequenceStatus.RUNNING:
                    break
            if seq.status is SequenceStatus.RUNNING:
                decodes.append(seq)
        # a sequence given its room earlier in this loop may have been a later one's victim
        return [seq for seq in decodes if seq.status is SequenceStatus.RUNNING]

    def _victim(self) -> Sequence:
        """The running sequence to take out when a decode finds the pool dry: the newest that
        has not streamed a token yet (a prompt waits a little longer for its first token, and no
        answer stops mid-stream), else the newest."""
        silent = [seq for seq in self.running if not seq.num_output_tokens]
        return (silent or self.running)[-1]

    def _drafts(self, decoding: list[Sequence]) -> dict[int, list[int]]:
        """Each decoding sequence's draft this step, by seq id: while few decode, for those whose
        draft found its room in the pool."""
        if not self.speculative_tokens or len(decoding) > DRAFT_UP_TO_DECODES:
            return {}
        drafts = {}
        for seq in decoding:
            draft = propose(seq.token_ids, self._draft_room(seq))
            if draft and self.blocks.grow(seq, len(seq.token_ids) + len(draft)):
                drafts[seq.seq_id] = draft
        return drafts

    def _draft_room(self, seq: Sequence) -> int:
        """The longest draft `seq` may have: none while its end tokens are suppressed (before
        min_tokens: so no draft position ever is), nor while it asks for log probabilities;
        else up to its `draft_limit` (at first `speculative_tokens`), leaving room for the token
        after it within its max_tokens and the longest a sequence may be, and the drafting
        decodes within `max_batch_tokens` (a sliding group's pages are reserved for a window and
        a chunk of at most that)."""
        if seq.num_output_tokens < seq.request.sampling.min_tokens:
            return 0
        if seq.request.sampling.logprobs is not None:  # a verified draft has no log probabilities
            return 0
        left = _work_left(seq)
        if self.max_seq_tokens is not None:
            left = min(left, self.max_seq_tokens - len(seq.token_ids))
        in_step = self.max_batch_tokens // DRAFT_UP_TO_DECODES - 1
        return min(seq.draft_limit or self.speculative_tokens, in_step, left - 1)

    def _add_chunk(self, items: list[BatchItem], seq: Sequence, budget: int) -> int:
        """Add a chunk of `seq`'s prompt to the step; returns its tokens. Its sliding groups
        trade the pages their window left for the chunk's: when pages they gave back were
        shared and the pool is out, it steps aside (preempted, resuming from its cache) rather
        than take the room of sequences already in this step."""
        count = min(self._pending(seq), budget)
        if not self.blocks.grow(seq, seq.num_computed_tokens + count):
            self._preempt(seq)
            return 0
        items.append(self._item(seq, count))
        return count

    def _fit(self, seq: Sequence) -> Fit:
        return self.blocks.fit(seq, headroom=len(self.running))

    def _admit_next(self) -> Sequence | None:
        """Admit the first waiting sequence that fits, in order: one that lacks room lets those
        behind it go ahead only while it is `_passable`, so that nobody waits behind a request
        for long while room it cannot use goes unused, and nobody is passed for ever."""
        if len(self.running) + len(self.restoring) >= self.max_running:
            return None
        now = self.clock()
        for seq in self.waiting:
            fit = self._fit(seq)
            if fit.lacking <= 0:
                self.waiting.remove(seq)
                self._admit(seq, fit)
                return seq
            if not _passable(seq, now):
                return None
        return None

    def _admit(self, seq: Sequence, fit: Fit) -> None:
        """Give `seq` its blocks; it runs now, or once the blocks only the disk has are in."""
        restore = self.blocks.admit(seq, fit)
        if seq.first_scheduled_time is None:
            seq.first_scheduled_time = self.clock()
            seq.cache_tier = fit.tier
        if not seq.started:
            seq.missing_hash = fit.match.missing
        if restore is None:
            seq.block_hashes = list(fit.match.hashes)
            seq.num_computed_tokens = fit.match.num_tokens
            self._start(seq, fit.match.num_tokens, 0)
        else:
            seq.restore = restore
            seq.status = SequenceStatus.RESTORING
            self.restoring.append(seq)
            self._to_restore.append(seq)

    def _start(self, seq: Sequence, cached_tokens: int, disk_tokens: int) -> None:
        """Run a sequence; the first time, its prompt's reused tokens are what its usage says
        came from the cache (a resume after preemption reuses what it computed itself)."""
        if not seq.started:
            seq.started = True
            seq.num_cached_tokens, seq.num_disk_tokens = cached_tokens, disk_tokens
        seq.status = SequenceStatus.RUNNING
        self.running.append(seq)

    def _preempt(self, seq: Sequence) -> None:
        """Take a running sequence out, keeping everything it computed cached (its partial last
        block too), so it resumes from the cache — memory, or disk if the pool needs the room."""
        self.preemptions += 1
        seq.preempted_at = self.clock()
        self.running.remove(seq)
        self.blocks.cache_tail(seq)
        self.blocks.release(seq)
        seq.num_computed_tokens = 0
        seq.status = SequenceStatus.WAITING
        self.waiting.appendleft(seq)

    def _item(self, seq: Sequence, count: int, draft: list[int] | None = None) -> BatchItem:
        start = seq.num_computed_tokens
        sample = start + count == len(seq.token_ids)
        draft = draft or []
        sampling = seq.request.sampling
        held_back = sample and seq.num_output_tokens < sampling.min_tokens
        return BatchItem(
            seq_id=seq.seq_id,
            token_ids=seq.token_ids[start : start + count] + draft,
            start_pos=start,
            block_tables=[table.padded() for table in seq.block_tables],
            sample=sample,
            sampling=sampling,
            num_output_tokens=seq.num_output_tokens,
            suppress_token_ids=self._end_tokens(seq) if held_back else (),
            context_token_ids=seq.token_ids if sample and sampling.repetition_penalty != 1 else [],
            draft_token_ids=tuple(draft),
        )

    def _end_tokens(self, seq: Sequence) -> tuple[int, ...]:
        return self.end_token_ids + seq.request.sampling.stop_token_ids


def _token_id(token: int | TokenLogprob) -> int:
    return token if isinstance(token, int) else token.token_id
