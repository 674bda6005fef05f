"""What structured output costs: decode tokens/s of SmolLM2 with and without a JSON schema, at
batch 1 and batch 8, through the real engine (the grammar's masks are computed and applied in
every step, as when serving).

    python benchmarks/structured_output.py [--tokens 128] [--repeats 3] [--device auto]

Each run decodes exactly `--tokens` tokens per sequence: unconstrained with the end token
ignored, constrained with a schema whose shortest answer is longer than that (an array of at
least 64 objects), so both do the same work but for the grammar. Decode speed counts the
tokens that arrive after every sequence of the batch has its first one (prefill excluded); the
best of `--repeats` runs of each is reported, the runs interleaved, as the machine may be
shared. Beside it: the process's CPU time per token, the runner's step time, and the
grammar's own share of a step (masks, applying them, matchers), which the load of a shared
machine moves far less than wall-clock rates.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from semantic.backends.torch import sampling
from semantic.commands.loader import build_engine
from semantic.core import Request, SamplingParams
from semantic.engine.engine import Engine
from semantic.settings.settings import Settings

LONG_ANSWER = {
    "type": "object",
    "properties": {
        "items": {
            "type": "array",
            "minItems": 64,
            "items": {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "maxLength": 12},
                    "n": {"type": "integer"},
                },
                "required": ["name", "n"],
                "additionalProperties": False,
            },
        }
    },
    "required": ["items"],
    "additionalProperties": False,
}
QUESTIONS = [
    "List the planets with their order from the sun.",
    "List some fruits and how many seeds they have.",
    "List the days of the week and their numbers.",
    "List famous books and the year they were written.",
    "List animals and how many legs they have.",
    "List colors and a number for each.",
    "List cities and their population in millions.",
    "List tools in a workshop and how many there are.",
]


def serving_engine(device: str, dtype: str, cache_dir: str) -> Engine:
    """SmolLM2 as `semantic serve` loads it (the same runner and options)."""
    settings = Settings(
        model="smollm2-135m",
        device=device,
        dtype=dtype,
        cache_dir=Path(cache_dir),
        cache_budget_mb=256,
        block_tokens=16,
        batch_window_ms=20,
        max_running=16,
    )
    return build_engine(settings)


async def decode_rate(
    engine: Engine, batch: int, tokens: int, constrained: bool
) -> tuple[float, float]:
    """Tokens/s decoded by a batch of `batch` sequences once all of them are decoding, and the
    process's CPU time per token generated (ms; all threads, the prompt's prefill included,
    which both kinds share): on a shared machine the steadier measure of the two."""
    grammar = engine.model.grammars.json_schema(LONG_ANSWER) if constrained else None
    params = SamplingParams(
        temperature=0, max_tokens=tokens, ignore_eos=not constrained, grammar=grammar
    )
    model = engine.model
    prompts = [
        model.tokenizer.encode(
            model.chat_template.render([{"role": "user", "content": q + " Answer in JSON."}])
        )
        for q in QUESTIONS[:batch]
    ]
    arrivals: list[list[tuple[float, int]]] = [[] for _ in prompts]

    async def one(index: int) -> None:
        request = Request(
            f"bench-{constrained}-{batch}-{index}-{time.monotonic_ns()}", prompts[index], params
        )
        async for event in engine.stream(request):
            if event.error is not None:
                raise event.error
            arrivals[index].append((time.perf_counter(), len(event.token_ids)))

    cpu_started = time.process_time()
    await asyncio.gather(*(one(i) for i in range(len(prompts))))
    cpu_s = time.process_time() - cpu_started
    all_decoding = max(times[0][0] for times in arrivals)
    end = max(times[-1][0] for times in arrivals)
    decoded = sum(n for times in arrivals for t, n in times if t > all_decoding)
    generated = sum(n for times in arrivals for _, n in times)
    return decoded / (end - all_decoding), 1000 * cpu_s / generated


class StepClock:
    """Time spent in the runner's steps and, of it, in grammar work (masks, applying them,
    matchers): the grammar's share of a step, which a shared machine's noise does not hide."""

    def __init__(self, engine: Engine) -> None:
        self.step_s = self.grammar_s = 0.0
        self.steps = 0
        runner: Any = engine.runner
        self._timed(runner, "run", grammar=False)
        self._timed(runner.grammars, "bitmask", grammar=True)
        self._timed(runner.grammars, "accept", grammar=True)
        self._timed(sampling, "masked_best", grammar=True)

    @property
    def step_ms(self) -> float:
        return 1000 * self.step_s / max(self.steps, 1)

    @property
    def grammar_ms(self) -> float:
        return 1000 * self.grammar_s / max(self.steps, 1)

    def _timed(self, owner: Any, name: str, grammar: bool) -> None:
        original = getattr(owner, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                spent = time.perf_counter() - started
                if grammar:
                    self.grammar_s += spent
                else:
                    self.step_s += spent
                    self.steps += 1

        setattr(owner, name, timed)

    def reset(self) -> None:
        self.step_s = self.grammar_s = 0.0
        self.steps = 0


def measure(engine: Engine, clock: StepClock, batch: int, tokens: int, repeats: int) -> Any:
    """The best of `repeats` runs of each kind, interleaved (a change in load hits both
    alike): decode tokens/s and the runner's mean step time, free and with a schema, and the
    grammar's own time per step."""
    rates: dict[str, list[float]] = {"free": [], "schema": []}
    cpu: dict[str, list[float]] = {"free": [], "schema": []}
    steps: dict[str, list[float]] = {"free": [], "schema": []}
    grammar_ms: list[float] = []
    for _ in range(repeats):
        for kind in ("free", "schema"):
            clock.reset()
            rate, cpu_per_token = asyncio.run(decode_rate(engine, batch, tokens, kind == "schema"))
            rates[kind].append(rate)
            cpu[kind].append(cpu_per_token)
            steps[kind].append(clock.step_ms)
            if kind == "schema":
                grammar_ms.append(clock.grammar_ms)
    best = {kind: max(runs) for kind, runs in rates.items()}
    step = {kind: min(runs) for kind, runs in steps.items()}
    cpu_ms = {kind: min(runs) for kind, runs in cpu.items()}
    result = {
        "free_tok_s": round(best["free"], 1),
        "schema_tok_s": round(best["schema"], 1),
        "cost_percent": round(100 * (1 - best["schema"] / best["free"]), 1),
        "free_cpu_ms_per_token": round(cpu_ms["free"], 2),
        "schema_cpu_ms_per_token": round(cpu_ms["schema"], 2),
        "cpu_cost_percent": round(100 * (cpu_ms["schema"] / cpu_ms["free"] - 1), 1),
        "free_step_ms": round(step["free"], 2),
        "schema_step_ms": round(step["schema"], 2),
        "step_cost_percent": round(100 * (step["schema"] / step["free"] - 1), 1),
        "grammar_ms_per_step": round(min(grammar_ms), 3),
    }
    print(
        f"batch {batch}: {result['free_tok_s']} tok/s free, {result['schema_tok_s']} with a "
        f"schema ({result['cost_percent']}% cost); CPU {result['free_cpu_ms_per_token']} ms a "
        f"token free, {result['schema_cpu_ms_per_token']} with a schema "
        f"({result['cpu_cost_percent']}%); a step {result['free_step_ms']} ms free, "
        f"{result['schema_step_ms']} ms with a schema ({result['step_cost_percent']}%), of which "
        f"the grammar's work {result['grammar_ms_per_step']} ms",
        flush=True,
    )
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    scratch = tempfile.TemporaryDirectory(prefix="semantic-bench-")  # not the user's cache
    engine = serving_engine(args.device, args.dtype, scratch.name)
    engine.start()
    started = time.perf_counter()
    engine.model.grammars.json_schema(LONG_ANSWER)
    compile_ms = (time.perf_counter() - started) * 1000
    results: dict[str, Any] = {"device": str(engine.runner.device), "tokens": args.tokens}  # type: ignore[attr-defined]
    results["first_compile_ms"] = round(compile_ms, 1)
    try:
        clock = StepClock(engine)
        for batch in (1, 8):
            results[f"batch_{batch}"] = measure(engine, clock, batch, args.tokens, args.repeats)
    finally:
        engine.stop()
        scratch.cleanup()
    print(json.dumps(results, indent=2))
    if args.json:
        with open(args.json, "w") as out:
            json.dump(results, out, indent=2)


if __name__ == "__main__":
    main()
