"""The admission and preemption policy under pressure, counted in engine steps, with no model.

N agents run at once through the real engine, scheduler, pool and disk tier, over the fake
runner (each token a hash of the context it reads back through the block tables): each sends its
next turn the moment its answer arrives. Steps are counted, not timed, so the policy's effect is
not hidden by the machine's noise; each step also sleeps `--step-ms`, so that disk reads (real
files, on a reader thread) take the share of a step they take with a real model.

    python benchmarks/pressure_policy.py [--agents 16] [--turns 4] [--step-ms 30]

It prints, for a pool that holds every agent and for one that holds 1/1.5 of them, with
newcomers allowed to take the place of answers that had their quantum (the rule before
2026-11-29, `scheduler_policy.py`'s `_TimeToFirstTokenFirst`) and with the scheduler as it is (a
streaming answer keeps its place): time to first token in steps (warm turns p50/p95, cold p50),
tokens prefilled ÷ new on warm turns, blocks restored from disk and preemptions.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scheduler_policy import _TimeToFirstTokenFirst
from semantic.backends.fake import FakeRunner
from semantic.core import Batch, Request, SamplingParams, TokenEvent
from semantic.engine.engine import Engine
from semantic.engine.runner import StepToken
from semantic.engine.scheduler import Scheduler
from semantic.engine.wiring import build_engine
from semantic.models.checkpoint import load_checkpoint
from semantic.models.registry import ModelRegistry
from semantic.models.served import ServedModel
from semantic.settings.options import engine_options
from semantic.settings.settings import Settings

BLOCK_TOKENS = 16
SYSTEM_TOKENS = 128
USER_TOKENS = 8
ANSWER_TOKENS = 16


class _SlowRunner(FakeRunner):
    """The fake runner, each step taking `step_s` as a model's would."""

    def __init__(self, step_s: float, **args: Any) -> None:
        super().__init__(**args)
        self.step_s = step_s

    def run(self, batch: Batch) -> list[StepToken]:
        time.sleep(self.step_s)
        return super().run(batch)


@dataclass(slots=True)
class _Turn:
    agent: int
    turn: int
    history: int  # tokens the agent had before this turn: all reusable
    prompt: int
    arrived: int  # engine steps so far when it was submitted
    first: int | None = None  # ... when its first token came
    cached: int = 0
    output: list[int] = field(default_factory=list)


def run(
    served: ServedModel,
    blocks: int,
    agents: int,
    turns: int,
    step_s: float,
    policy: type[Scheduler] = Scheduler,
) -> dict[str, float]:
    runner = _SlowRunner(step_s, num_blocks=blocks, block_tokens=BLOCK_TOKENS, vocab_size=8000,
                         first_token_id=100)  # fmt: skip
    with tempfile.TemporaryDirectory() as cache:
        settings = Settings(cache_dir=Path(cache), max_batch_tokens=64, batch_window_ms=0)
        engine = build_engine(runner, served, engine_options(settings))
        old = engine.scheduler
        engine.scheduler = policy(
            old.prefix,
            block_tokens=BLOCK_TOKENS,
            max_running=settings.max_running,
            max_batch_tokens=settings.max_batch_tokens,
            end_token_ids=old.end_token_ids,
            named=old.named,
        )
        done = _drive(engine, agents, turns)
        restored, preemptions = engine.tiering.traffic.restored, engine.scheduler.preemptions
        engine.stop()
    warm = [t.first - t.arrived for t in done if t.turn and t.first is not None]
    cold = [t.first - t.arrived for t in done if not t.turn and t.first is not None]
    prefilled = sum(t.prompt - t.cached for t in done if t.turn)
    new = sum(t.prompt - t.history for t in done if t.turn)
    return {
        "steps": len(runner.steps),
        "warm p50": statistics.median(warm),
        "warm p95": sorted(warm)[int(0.95 * (len(warm) - 1))],
        "cold p50": statistics.median(cold),
        "prefilled ÷ new": prefilled / new,
        "restored": restored,
        "preemptions": preemptions,
    }


def _drive(engine: Engine, agents: int, turns: int) -> list[_Turn]:
    """Every agent's turns, each sent the moment the one before it ends; the finished turns."""
    runner = engine.runner
    assert isinstance(runner, FakeRunner)
    histories = {
        a: [100 + (a * 31 + k * 7) % 7900 for k in range(SYSTEM_TOKENS)] for a in range(agents)
    }
    done: list[_Turn] = []
    due: list[int] = list(range(agents))

    def submit(agent: int, turn: int) -> None:
        prompt = [*histories[agent], *[50 + turn] * USER_TOKENS]
        record = _Turn(agent, turn, len(histories[agent]), len(prompt), len(runner.steps))

        def sink(event: TokenEvent) -> None:
            if event.token_ids and record.first is None:
                record.first = len(runner.steps)
            record.output += event.token_ids
            if event.final:
                assert event.error is None, event.error
                record.cached = event.usage.cached_tokens if event.usage else 0
                done.append(record)
                histories[agent] = [*prompt, *record.output]
                if turn + 1 < turns:
                    due.append(agent)

        sampling = SamplingParams(temperature=0.0, max_tokens=ANSWER_TOKENS, ignore_eos=True)
        engine.submit(Request(f"{agent}-{turn}", prompt, sampling, f"agent-{agent}"), sink)

    turn_of = dict.fromkeys(range(agents), 0)
    while due or engine.scheduler.has_work:
        for agent in due:
            submit(agent, turn_of[agent])
            turn_of[agent] += 1
        due.clear()
        if not engine.step():
            time.sleep(0.002)  # waiting for the disk reader: its records come through the inbox
    return done


def _system_prompt(agent: int) -> list[int]:
    return [100 + (agent * 31 + k * 7) % 7900 for k in range(SYSTEM_TOKENS)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agents", type=int, default=16)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--step-ms", type=float, default=30.0)
    args = parser.parse_args()
    path = ModelRegistry().resolve("smollm2-135m").path
    checkpoint = load_checkpoint(path, progress=False)
    served = ServedModel("smollm2-135m", checkpoint.config, checkpoint.tokenizer,
                         checkpoint.chat_template, 8192, checkpoint.fingerprint)  # fmt: skip
    final = SYSTEM_TOKENS + args.turns * (USER_TOKENS + ANSWER_TOKENS)
    need = args.agents * -(-final // BLOCK_TOKENS)
    print(f"{args.agents} agents × {args.turns} turns; every history needs {need} blocks")
    for pool, blocks in (("holds all", 3 * need), ("1/1.5 of all", int(need / 1.5))):
        policies = (("newcomers preempt (before)", _TimeToFirstTokenFirst), ("as it is", Scheduler))
        for policy, scheduler in policies:
            result = run(served, blocks, args.agents, args.turns, args.step_ms / 1000, scheduler)
            cells = ", ".join(
                f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}" for k, v in result.items()
            )
            print(f"pool {pool} ({blocks} blocks), {policy}: {cells}")


if __name__ == "__main__":
    main()
