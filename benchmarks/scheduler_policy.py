"""Which prompt tokens each engine step computes, with 16 agents arriving at once: the scheduler's
prefill policy against the alternatives, in simulated time.

    python benchmarks/scheduler_policy.py [--agents 16] [--turns 4] [--system-tokens 2000]
    python benchmarks/scheduler_policy.py --calibrate    # time the real runner, fit the cost
    python benchmarks/scheduler_policy.py --admission --read-ms 10   # who is admitted, instead
    python benchmarks/scheduler_policy.py --admission --read-ms 10 --agents 32 --turns 3 \
        --pool-mb 512 [--trace]   # --trace: who was preempted, by what, and for how long

The real engine, scheduler, block pool and disk tier run over the fake runner (each token a hash
of the context it reads back through the block tables, so a wrong schedule changes the output);
a step takes the time a cost model gives its batch — fixed, plus per prompt token, plus per
decoding sequence — on a virtual clock, so the table comes out the same on a busy machine as on
a quiet one. Each agent has its own system prompt and sends its next turn the moment its answer
ends, as `semantic bench`'s crowd does; a block read from disk lands before the next step.

For each scenario and policy it prints time to first token of cold turns (each agent's first)
and warm ones, inter-token latency (every gap between two tokens of one answer) and the longest
gap, the answer time (arrival to last token) and the wall time, in seconds.
"""

from __future__ import annotations

import argparse
import inspect
import math
import statistics
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from semantic.backends.fake import FakeRunner
from semantic.cache.pages.block_manager import BlockManager, Fit
from semantic.cache.pages.prefix import PrefixCache, PrefixMatch
from semantic.core import (
    Batch,
    BatchItem,
    Request,
    SamplingParams,
    Sequence,
    SequenceStatus,
    TokenEvent,
)
from semantic.engine.engine import Engine
from semantic.engine.runner import ModelRunner, StepToken
from semantic.engine.scheduler import Scheduler
from semantic.engine.wiring import build_engine
from semantic.models.checkpoint import load_checkpoint
from semantic.models.registry import ModelRegistry
from semantic.models.served import ServedModel
from semantic.settings.options import engine_options
from semantic.settings.settings import Settings
from semantic_bench.workload import percentile

if TYPE_CHECKING:
    from runner_microbench import Gate

BLOCK_TOKENS = 256
BLOCK_BYTES = 23_040 * BLOCK_TOKENS  # SmolLM2-135M: bf16 K and V of 30 layers × 3 heads × 64
USER_TOKENS = 66  # a 50-token user message and the chat template around it


@dataclass(frozen=True, slots=True)
class StepCost:
    """Seconds one engine step takes: fixed, plus per prompt token, plus per decoding sequence."""

    fixed_s: float
    prompt_token_s: float
    decode_s: float

    def of(self, batch: Batch) -> float:
        decodes = sum(1 for i in batch.items if len(i.token_ids) == 1 and i.num_output_tokens)
        prompt = batch.num_tokens - decodes
        return self.fixed_s + prompt * self.prompt_token_s + decodes * self.decode_s


# SmolLM2-135M, bf16, our CPU kernels, one 2-core AMD EPYC (Zen 4), quiet
# (docs/benchmark-history.md, "The runner alone"): one sequence decodes in 13.8 ms a step and
# eight in 30.5 ms at 1,000 tokens of context, so 2.4 ms a sequence on 11.4 ms; 1,000 prompt
# tokens in chunks of 512 take 0.949 s, so 0.93 ms a token. `--calibrate` measures them again.
SMOLLM2_CPU = StepCost(fixed_s=0.0114, prompt_token_s=0.00093, decode_s=0.0024)


class Clock:
    """Simulated seconds since the run began."""

    def __init__(self) -> None:
        self.now = 0.0


class _TimedRunner(FakeRunner):
    """The fake runner on a virtual clock: each step advances it by the step's modelled cost."""

    def __init__(self, cost: StepCost, clock: Clock, *, num_blocks: int, block_tokens: int) -> None:
        super().__init__(
            num_blocks=num_blocks, block_tokens=block_tokens, vocab_size=8000, first_token_id=100
        )
        self.cost = cost
        self.clock = clock

    def run(self, batch: Batch) -> list[StepToken]:
        self.clock.now += self.cost.of(batch)
        return super().run(batch)


# -- the policies: the scheduler as it is, and what it was measured against ------------------


class _OneOffsWaitForNothingRunning(BlockManager):
    """A one-off may take agents' cached pages only once nothing runs (before 2026-11-29)."""

    def fit(self, seq: Sequence, headroom: int) -> Fit:
        if not headroom:
            return super().fit(seq, headroom)
        clock = self.clock
        self.clock = lambda: seq.request.arrival_time  # never patient long enough
        try:
            return super().fit(seq, headroom)
        finally:
            self.clock = clock


class _TimeToFirstTokenFirst(Scheduler):
    """The admission rule before 2026-11-29 (docs/design.md): while the line is stuck for room,
    the first request that has not started goes ahead of it, taking the place of running
    sequences that have streamed `QUANTUM` tokens since they last started, those with the most
    left to do first; a one-off waiting for agents' room is passed for its first 5 s and then
    waits until nothing runs."""

    QUANTUM = 8
    PASSED_S = 5.0

    def __init__(self, prefix: PrefixCache, **options: Any) -> None:
        super().__init__(prefix, **options)
        self.blocks = _OneOffsWaitForNothingRunning(
            prefix, options["block_tokens"], options["max_batch_tokens"], self.clock
        )
        self.outputs_at_start: dict[int, int] = {}

    def schedule(self) -> Batch:
        self._admit_newcomers()
        return super().schedule()

    def _admit_next(self) -> Sequence | None:
        if len(self.running) + len(self.restoring) >= self.max_running:
            return None
        for seq in self.waiting:
            fit = self._fit(seq)
            if fit.lacking <= 0:
                self.waiting.remove(seq)
                self._admit(seq, fit)
                return seq
            passable = self.clock() - seq.request.arrival_time < self.PASSED_S
            if not (fit.kept_from_agents and passable):
                return None
        return None

    def _admit_newcomers(self) -> None:
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
                if fit.lacking > 0:
                    return
            self.waiting.remove(newcomer)
            self._admit(newcomer, fit)

    def _preempt_for(self, fit: Fit) -> bool:
        victims, room = [], 0
        left = lambda seq: seq.request.sampling.max_tokens - seq.num_output_tokens  # noqa: E731
        for seq in sorted(self._preemptible(), key=left, reverse=True):
            if room >= fit.lacking:
                break
            victims.append(seq)
            room += self._freed_by(seq, fit) + self.blocks.pages_per_block
        if room < fit.lacking:
            return False
        for seq in victims:
            self._preempt(seq)
        return True

    def _preemptible(self) -> list[Sequence]:
        return [
            seq
            for seq in self.running
            if seq.num_output_tokens - self.outputs_at_start.get(seq.seq_id, 0) >= self.QUANTUM
        ]

    def _freed_by(self, seq: Sequence, fit: Fit) -> int:
        """Pages preempting `seq` would make available to `fit`: those only it holds, when it
        caches at a tier `fit` may reclaim, but those `fit` reuses."""
        if seq.cache_tier > fit.max_tier:
            return 0
        reused = set(fit.match.in_memory)
        pages = (p for table in seq.block_tables for p in table.pages if p not in reused)
        return sum(self.pool.refcount(p) == 1 for p in pages)

    def _start(self, seq: Sequence, cached_tokens: int, disk_tokens: int) -> None:
        self.outputs_at_start[seq.seq_id] = seq.num_output_tokens
        super()._start(seq, cached_tokens, disk_tokens)

    def _victim(self) -> Sequence:
        return self.running[-1]


class _Capped(Scheduler):
    """Prompt tokens beside decodes capped at `cap` (None: whatever the step has left)."""

    cap: int | None = None

    def _prefill_budget(self, decodes: int) -> int:
        budget = self.max_batch_tokens - decodes
        return budget if not decodes or self.cap is None else min(budget, self.cap)


class _FirstComeFirstServed(_Capped):
    def _prefill_order(self) -> list[Sequence]:
        return [seq for seq in self.running if self._pending(seq) > 1]


class _LeastComputedFirst(_Capped):
    """Fair across agents: the prompt that has had the fewest tokens computed goes first."""

    def _prefill_order(self) -> list[Sequence]:
        prefilling = [seq for seq in self.running if self._pending(seq) > 1]
        return sorted(prefilling, key=lambda s: s.num_computed_tokens - s.num_cached_tokens)


class _FairQueuing(_Capped):
    """Weighted fair queuing over prompts: each is tagged on arrival with the virtual time at
    which it would finish if every prompt in line (running or waiting) shared the steps equally,
    and the earliest tag goes first."""

    def __init__(self, prefix: PrefixCache, **options: Any) -> None:
        super().__init__(prefix, **options)
        self.virtual = 0.0  # prompt tokens each prompt in prefill would have had by now
        self.tags: dict[int, float] = {}

    def add(self, seq: Sequence) -> PrefixMatch:
        match = super().add(seq)
        self.tags[seq.seq_id] = self.virtual + len(seq.token_ids) - match.num_tokens
        return match

    def _prefill_order(self) -> list[Sequence]:
        prefilling = [seq for seq in self.running if self._pending(seq) > 1]
        return sorted(prefilling, key=lambda seq: self.tags[seq.seq_id])

    def _prefill_chunks(self, budget: int) -> list[BatchItem]:
        sharing = len(self._prefill_order()) + len(self.waiting) or 1
        chunks = super()._prefill_chunks(budget)
        self.virtual += sum(len(item.token_ids) for item in chunks) / sharing
        return chunks


class _Before(_TimeToFirstTokenFirst):
    """The scheduler before this policy: decodes, then prompts in the order they were admitted
    (admitting more only while the step has room), each step filled to `max_batch_tokens`."""

    def schedule(self) -> Batch:
        self.blocks.release_copy_sources()
        self._admit_newcomers()
        budget = self.max_batch_tokens
        items = [self._item(seq, 1) for seq in self._grow_decodes()]
        budget -= len(items)
        for seq in list(self.running):
            if budget > 0 and seq.status is SequenceStatus.RUNNING and self._pending(seq) > 1:
                budget -= self._add_chunk(items, seq, budget)
        while budget > 0 and (admitted := self._admit_next()) is not None:
            if admitted.status is SequenceStatus.RUNNING:
                budget -= self._add_chunk(items, admitted, budget)
        return Batch(items, self.blocks.take_copies())


def _capped(base: type[_Capped], cap: int | None) -> type[Scheduler]:
    return type(base.__name__, (base,), {"cap": cap})


POLICIES: dict[str, type[Scheduler]] = {
    "before: first come first served, whole steps": _Before,
    "first come first served, ≤256 beside decodes": _capped(_FirstComeFirstServed, 256),
    "shortest first, whole steps": _capped(_Capped, None),
    "**shortest first, ≤256 beside decodes (the policy)**": Scheduler,
    "shortest first, ≤128 beside decodes": _capped(_Capped, 128),
    "shortest first, ≤64 beside decodes": _capped(_Capped, 64),
    "least computed first (fair), ≤256 beside decodes": _capped(_LeastComputedFirst, 256),
    "fair queuing (virtual finish), ≤256 beside decodes": _capped(_FairQueuing, 256),
}


class _SmallestJobFirst(_TimeToFirstTokenFirst):
    """Shortest job first, for admission (tried 2026-11-27, not kept: docs/design.md). A job is
    its uncached prompt and its answer, in decode steps (`PROMPT_TOKENS_PER_STEP` prompt tokens
    a step). The line is taken smallest job first, unless newer ones were admitted ahead of one
    by `OVERTAKE_LIMIT` times its job (then it goes first); the first in line may take the
    place of running sequences with more left to generate than its whole job (after their
    quantum; a starved one takes anyone's), so an answer near its end is never cut off."""

    PROMPT_TOKENS_PER_STEP = 32
    OVERTAKE_LIMIT = 32

    def __init__(self, prefix: PrefixCache, **options: Any) -> None:
        super().__init__(prefix, **options)
        self.uncached: dict[int, int] = {}
        self.passed_by: dict[int, float] = {}
        self.smaller_than = -1.0

    def add(self, seq: Sequence) -> PrefixMatch:
        match = super().add(seq)
        self.uncached[seq.seq_id] = len(seq.token_ids) - match.num_tokens
        return match

    def _job(self, seq: Sequence) -> float:
        left = seq.request.sampling.max_tokens - seq.num_output_tokens
        return (
            left if seq.started else self.uncached[seq.seq_id] / self.PROMPT_TOKENS_PER_STEP + left
        )

    def _starved_first(self) -> Sequence | None:
        limit = self.OVERTAKE_LIMIT
        starved = [
            s for s in self.waiting if self.passed_by.get(s.seq_id, 0) >= limit * self._job(s)
        ]
        return min(starved, key=lambda seq: seq.seq_id, default=None)

    def _line(self) -> list[Sequence]:
        first = self._starved_first()
        rest = sorted((seq for seq in self.waiting if seq is not first), key=self._job)
        return [first, *rest] if first is not None else rest

    def _admit(self, seq: Sequence, fit: Fit) -> None:
        job = self._job(seq)
        for waiting in self.waiting:
            if waiting.seq_id < seq.seq_id:
                self.passed_by[waiting.seq_id] = self.passed_by.get(waiting.seq_id, 0) + job
        self.passed_by.pop(seq.seq_id, None)
        super()._admit(seq, fit)

    def _admit_newcomers(self) -> None:
        while self.waiting and len(self.running) + len(self.restoring) < self.max_running:
            first = self._line()[0]
            fit = self._fit(first)
            if fit.lacking <= 0:
                return
            starved = first is self._starved_first()
            self.smaller_than = -1.0 if starved else self._job(first)
            if not self._preempt_for(fit):
                return
            self.waiting.remove(first)
            self._admit(first, self._fit(first))

    def _preemptible(self) -> list[Sequence]:
        return [
            seq
            for seq in super()._preemptible()
            if seq.request.sampling.max_tokens - seq.num_output_tokens > self.smaller_than
        ]

    def _admit_next(self) -> Sequence | None:
        if len(self.running) + len(self.restoring) >= self.max_running:
            return None
        for seq in self._line()[:1]:
            fit = self._fit(seq)
            if fit.lacking <= 0:
                self.waiting.remove(seq)
                self._admit(seq, fit)
                return seq
        return None


class _OneOffsKeptFromAgents(Scheduler):
    """A streaming answer keeps its place, but a one-off still takes no agent's cached page
    while anything runs (tried 2026-11-29, not kept: docs/design.md)."""

    def __init__(self, prefix: PrefixCache, **options: Any) -> None:
        super().__init__(prefix, **options)
        self.blocks = _OneOffsWaitForNothingRunning(
            prefix, options["block_tokens"], options["max_batch_tokens"], self.clock
        )


ADMISSION_POLICIES: dict[str, type[Scheduler]] = {
    "time to first token first (before)": _TimeToFirstTokenFirst,
    "a streaming answer keeps its place, one-offs kept from agents' pages": _OneOffsKeptFromAgents,
    "**a streaming answer keeps its place (the policy)**": Scheduler,
}


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    pool_mb: int
    stagger_s: float  # between one agent's first turn and the next's


SCENARIOS = [
    Scenario("at once, 512 MiB pool", 512, 0.0),
    Scenario("at once, 2 GiB pool (every history fits)", 2048, 0.0),
    Scenario("one every 3 s, 512 MiB pool", 512, 3.0),
    Scenario("one every 2 s, 512 MiB pool (prompts arrive as fast as they are computed)", 512, 2.0),
]


# -- one run ------------------------------------------------------------------------------------


@dataclass(slots=True)
class _Turn:
    agent: int
    turn: int
    arrived: float
    token_times: list[float] = field(default_factory=list)
    output: list[int] = field(default_factory=list)


def run(
    served: ServedModel,
    policy: type[Scheduler],
    scenario: Scenario,
    args: argparse.Namespace,
    cost: StepCost,
) -> dict[str, float]:
    clock = Clock()
    blocks = scenario.pool_mb * 2**20 // BLOCK_BYTES
    runner = _TimedRunner(cost, clock, num_blocks=blocks, block_tokens=BLOCK_TOKENS)
    with tempfile.TemporaryDirectory() as cache:
        settings = Settings(cache_dir=Path(cache), batch_window_ms=0)
        engine = build_engine(runner, served, engine_options(settings))
        old = engine.scheduler
        engine.scheduler = policy(
            old.prefix,
            block_tokens=BLOCK_TOKENS,
            max_running=settings.max_running,
            max_batch_tokens=settings.max_batch_tokens,
            end_token_ids=old.end_token_ids,
            clock=lambda: clock.now,
        )
        # Reads from disk on the engine thread: they land before the next step, every run alike,
        # each block costing `--read-ms`.
        read = engine.tiering._read
        blocks_read = 0

        def timed_read(wanted: list[Any], deliver: Any) -> None:
            nonlocal blocks_read
            clock.now += args.read_ms / 1000 * len(wanted)
            blocks_read += len(wanted)
            read(wanted, deliver)

        engine.tiering.read = timed_read  # type: ignore[method-assign]
        waits = _trace_preemptions(engine.scheduler, clock) if args.trace else None
        done = _drive(engine, clock, scenario.stagger_s, args)
        engine.stop()
    if waits is not None:
        _print_waits(waits)
    return _figures(done, clock.now) | {"blocks read": blocks_read}


@dataclass(slots=True)
class _Wait:
    """One preempted sequence's time out: when, after how many tokens, by which call, and how
    many requests in line had not started when it left and when it came back."""

    seq_id: int
    out_s: float
    tokens: int
    by: str
    unstarted_out: int
    back_s: float | None = None
    unstarted_back: int = 0


def _trace_preemptions(scheduler: Scheduler, clock: Clock) -> list[_Wait]:
    """Record every preemption and resume of `scheduler` on the virtual clock (`--trace`)."""
    waits: list[_Wait] = []
    preempt, start = scheduler._preempt, scheduler._start

    def unstarted() -> int:
        return sum(1 for seq in scheduler.waiting if not seq.started)

    def traced_preempt(seq: Sequence) -> None:
        by = inspect.stack()[1].function
        waits.append(_Wait(seq.seq_id, clock.now, seq.num_output_tokens, by, unstarted()))
        preempt(seq)

    def traced_start(seq: Sequence, cached_tokens: int, disk_tokens: int) -> None:
        wait = next((w for w in reversed(waits) if w.seq_id == seq.seq_id), None)
        if seq.started and wait is not None and wait.back_s is None:
            wait.back_s, wait.unstarted_back = clock.now, unstarted()
        start(seq, cached_tokens, disk_tokens)

    scheduler._preempt = traced_preempt  # type: ignore[method-assign]
    scheduler._start = traced_start  # type: ignore[method-assign]
    return waits


def _print_waits(waits: list[_Wait]) -> None:
    by = {name: sum(1 for w in waits if w.by == name) for name in {w.by for w in waits}}
    print(f"preemptions: {len(waits)} ({', '.join(f'{n} by {f}' for f, n in by.items())})")
    longest = sorted(waits, key=lambda w: (w.back_s or math.inf) - w.out_s, reverse=True)
    for w in longest[:5]:
        back = "never" if w.back_s is None else f"{w.back_s:.1f} s"
        print(
            f"  seq {w.seq_id}: out at {w.out_s:.1f} s after {w.tokens} tokens, back at {back}; "
            f"requests in line not yet started: {w.unstarted_out} → {w.unstarted_back}"
        )


def _figures(done: list[_Turn], wall_s: float) -> dict[str, float]:
    cold = [t.token_times[0] - t.arrived for t in done if t.turn == 0]
    warm = [t.token_times[0] - t.arrived for t in done if t.turn > 0]
    gaps = [b - a for t in done for a, b in zip(t.token_times, t.token_times[1:], strict=False)]
    answers = [t.token_times[-1] - t.arrived for t in done]
    return {
        "cold p50": statistics.median(cold),
        "cold p95": percentile(cold, 95),
        "warm p50": statistics.median(warm),
        "warm p95": percentile(warm, 95),
        "ITL p50": statistics.median(gaps),
        "ITL p95": percentile(gaps, 95),
        "longest gap": max(gaps),
        "answer p50": statistics.median(answers),
        "answer p95": percentile(answers, 95),
        "wall": wall_s,
    }


def _drive(engine: Engine, clock: Clock, stagger_s: float, args: argparse.Namespace) -> list[_Turn]:
    """Every agent's turns, each sent the moment the one before it ends; the finished turns."""
    histories = {
        a: [100 + (a * 31 + k * 7) % 7900 for k in range(args.system_tokens)]
        for a in range(args.agents)
    }
    done: list[_Turn] = []
    due: list[tuple[int, int]] = []  # (agent, turn) to submit now
    first_turns = {a: a * stagger_s for a in range(args.agents)}

    def submit(agent: int, turn: int) -> None:
        prompt = [*histories[agent], *[50 + turn] * USER_TOKENS]
        record = _Turn(agent, turn, clock.now)

        def sink(event: TokenEvent) -> None:
            record.token_times += [clock.now] * len(event.token_ids)
            record.output += event.token_ids
            if event.final:
                assert event.error is None, event.error
                done.append(record)
                histories[agent] = [*prompt, *record.output]
                if turn + 1 < args.turns:
                    due.append((agent, turn + 1))

        sampling = SamplingParams(temperature=0.0, max_tokens=args.answer_tokens, ignore_eos=True)
        name = None if args.anonymous else f"agent-{agent}"
        request = Request(f"{agent}-{turn}", prompt, sampling, name, arrival_time=clock.now)
        engine.submit(request, sink)

    idle_steps = 0
    while due or first_turns or engine.scheduler.has_work:
        if not (due or engine.scheduler.has_work):  # nothing to do until the next arrival
            clock.now = max(clock.now, min(first_turns.values()))
        for agent, at in list(first_turns.items()):
            if at <= clock.now:
                due.append((agent, 0))
                del first_turns[agent]
        for agent, turn in due:
            submit(agent, turn)
        due.clear()
        idle_steps = 0 if engine.step() else idle_steps + 1
        assert idle_steps < 1000, "the engine made no progress"
    return done


# -- calibration --------------------------------------------------------------------------------


def calibrate() -> StepCost:
    """Time the real runner (the default model, as `semantic serve` loads it) on decode steps,
    prompt chunks and mixed steps, each when the machine is quiet, and fit the step cost."""
    import numpy as np

    from runner_microbench import Gate
    from semantic.commands.loader import build_engine

    shapes = [(1, 0), (8, 0), (16, 0), (0, 128), (0, 256), (0, 512), (16, 128), (8, 256)]
    with tempfile.TemporaryDirectory() as cache:
        engine = build_engine(Settings(cache_dir=Path(cache), cache_budget_mb=1024))
        gate, rows = Gate(limit=0.10, patience_s=120), []
        for decodes, prompt in shapes:
            seconds = _time_step(engine.runner, _calibration_batch(decodes, prompt), gate)
            rows.append((decodes, prompt, seconds))
            print(f"  {decodes:2d} decodes + {prompt:3d} prompt tokens: {seconds * 1000:6.1f} ms")
        engine.stop()
    design = np.array([[1.0, prompt, decodes] for decodes, prompt, _ in rows])
    fit = np.linalg.lstsq(design, np.array([s for *_, s in rows]), rcond=None)[0]
    shares = sorted(gate.shares)
    print(f"others used {statistics.median(shares):.0%} of the CPUs in the median window")
    return StepCost(*(float(v) for v in fit))


def _time_step(runner: ModelRunner, batch: Batch, gate: Gate) -> float:
    """Median seconds of a step of `batch` over 5, timed when the machine is quiet."""
    from runner_microbench import timed

    runner.run(batch)  # warm-up
    return gate.measure(lambda: timed(lambda: runner.run(batch), 5))


def _calibration_batch(decodes: int, prompt: int) -> Batch:
    """`decodes` sequences at 2,048 tokens of context and one prompt chunk at 1,024."""
    greedy = SamplingParams(temperature=0.0)
    per_seq = 9  # blocks of 256 for 2,048 tokens and the next
    items = [
        BatchItem(i, [5], 2048, [list(range(i * per_seq, (i + 1) * per_seq))], True, greedy, 1)
        for i in range(decodes)
    ]
    if prompt:
        table = [list(range(16 * per_seq, 17 * per_seq))]  # one layer group: SmolLM2's
        items.append(BatchItem(99, list(range(1000, 1000 + prompt)), 1024, table, True, greedy, 0))
    return Batch(items)


# -- the table ----------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agents", type=int, default=16)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--system-tokens", type=int, default=2000)
    parser.add_argument("--answer-tokens", type=int, default=64)
    parser.add_argument("--calibrate", action="store_true", help="fit the cost on this machine")
    parser.add_argument(
        "--admission", action="store_true", help="compare who is admitted, not prefill policies"
    )
    parser.add_argument("--read-ms", type=float, default=0.0, help="a block read from disk")
    parser.add_argument("--pool-mb", type=int, help="one scenario: everyone at once, this pool")
    parser.add_argument(
        "--anonymous", action="store_true", help="no agent ids: first turns are one-offs"
    )
    parser.add_argument(
        "--trace", action="store_true", help="print each run's preemptions and longest waits"
    )
    args = parser.parse_args()
    cost = calibrate() if args.calibrate else SMOLLM2_CPU
    print(
        f"step cost: {cost.fixed_s * 1000:.1f} ms + {cost.prompt_token_s * 1000:.3f} ms a prompt "
        f"token + {cost.decode_s * 1000:.2f} ms a decoding sequence"
    )
    path = ModelRegistry().resolve("smollm2-135m").path
    checkpoint = load_checkpoint(path, progress=False)
    served = ServedModel("smollm2-135m", checkpoint.config, checkpoint.tokenizer,
                         checkpoint.chat_template, 8192, checkpoint.fingerprint)  # fmt: skip
    policies = ADMISSION_POLICIES if args.admission else POLICIES
    scenarios = SCENARIOS
    if args.pool_mb:
        scenarios = [Scenario(f"at once, {args.pool_mb} MiB pool", args.pool_mb, 0.0)]
    for scenario in scenarios:
        print(
            f"\n{args.agents} agents × {args.turns} turns, {args.system_tokens:,}-token system "
            f"prompts, {args.answer_tokens}-token answers; {scenario.name} (seconds)\n"
        )
        results = {}
        for name, policy in policies.items():
            if args.trace:
                print(f"{name}:")
            results[name] = run(served, policy, scenario, args, cost)
        _print_rows(results)


def _print_rows(results: dict[str, dict[str, float]]) -> None:
    columns = {
        "TTFT cold p50 / p95": ("cold p50", "cold p95"),
        "TTFT warm p50 / p95": ("warm p50", "warm p95"),
        "ITL p50 / p95": ("ITL p50", "ITL p95"),
        "longest gap": ("longest gap",),
        "answer p50 / p95": ("answer p50", "answer p95"),
        "wall": ("wall",),
        "blocks read": ("blocks read",),
    }

    def cell(row: dict[str, float], keys: tuple[str, ...]) -> str:
        return " / ".join(
            f"{row[key]:.2f}" if key != "blocks read" else f"{row[key]:,}" for key in keys
        )

    print("| policy | " + " | ".join(columns) + " |")
    print("|---|" + "---:|" * len(columns))
    for name, row in results.items():
        print(f"| {name} | " + " | ".join(cell(row, keys) for keys in columns.values()) + " |")


if __name__ == "__main__":
    main()
