"""What structured output costs: decode tokens/s of SmolLM2 with and without a JSON schema, at
batch 1 and batch 8, through the real engine (the grammar's masks are computed and applied in
every step, as when serving).

    python benchmarks/structured_output.py [--tokens 128] [--repeats 3] [--device auto]

Each run decodes exactly `--tokens` tokens per sequence: unconstrained with the end token
ignored, constrained with a schema whose shortest answer is longer than that (an array of at
least 64 strings), so both do the same work but for the grammar. Decode speed counts the
tokens that arrive after every sequence of the batch has its first one (prefill excluded); the
best of `--repeats` runs of each is reported, the runs interleaved, as the machine may be
shared.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from typing import Any

from semantic.backends.torch.runner import TorchRunner
from semantic.config import Settings
from semantic.core import Request, SamplingParams
from semantic.engine.engine import Engine
from semantic.models.checkpoint import load_checkpoint
from semantic.models.served import ServedModel
from semantic.registry import ModelRegistry

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


def build_engine(device: str, dtype: str) -> Engine:
    path = ModelRegistry().resolve("smollm2-135m").path
    checkpoint = load_checkpoint(path, progress=False)
    runner = TorchRunner(
        checkpoint.config,
        checkpoint.weights(),
        block_tokens=16,
        cache_budget_mb=256,
        dtype=dtype,
        device=device,
    )
    served = ServedModel(
        "smollm2-135m",
        checkpoint.config,
        checkpoint.tokenizer,
        checkpoint.chat_template,
        checkpoint.config.max_position_embeddings,
        checkpoint.fingerprint,
    )
    return Engine(runner, served, Settings(batch_window_ms=20, max_running=16))


async def decode_rate(engine: Engine, batch: int, tokens: int, constrained: bool) -> float:
    """Tokens/s decoded by a batch of `batch` sequences once all of them are decoding."""
    grammar = engine.model.grammars.json_schema(LONG_ANSWER) if constrained else None
    sampling = SamplingParams(
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
            f"bench-{constrained}-{batch}-{index}-{time.monotonic_ns()}", prompts[index], sampling
        )
        async for event in engine.stream(request):
            if event.error is not None:
                raise event.error
            arrivals[index].append((time.perf_counter(), len(event.token_ids)))

    await asyncio.gather(*(one(i) for i in range(len(prompts))))
    all_decoding = max(times[0][0] for times in arrivals)
    end = max(times[-1][0] for times in arrivals)
    decoded = sum(n for times in arrivals for t, n in times if t > all_decoding)
    return decoded / (end - all_decoding)


class StepClock:
    """Time spent in the runner's steps and, of it, in grammar work (masks and matchers): the
    grammar's share of a step, which a shared machine's noise does not hide."""

    def __init__(self, engine: Engine) -> None:
        self.step_s = self.grammar_s = 0.0
        self.steps = 0
        runner: Any = engine.runner
        self._timed(runner, "run", grammar=False)
        self._timed(runner.grammars, "bitmask", grammar=True)
        self._timed(runner.grammars, "accept", grammar=True)

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    engine = build_engine(args.device, args.dtype)
    engine.start()
    started = time.perf_counter()
    engine.model.grammars.json_schema(LONG_ANSWER)
    compile_ms = (time.perf_counter() - started) * 1000
    results: dict[str, Any] = {"device": str(engine.runner.device), "tokens": args.tokens}  # type: ignore[attr-defined]
    results["first_compile_ms"] = round(compile_ms, 1)
    try:
        clock = StepClock(engine)
        for batch in (1, 8):
            runs: dict[str, list[float]] = {"free": [], "schema": []}
            step_ms = grammar_ms = 0.0
            for _ in range(args.repeats):  # interleaved: a change in load hits both alike
                for constrained in (False, True):
                    clock.reset()
                    rate = asyncio.run(decode_rate(engine, batch, args.tokens, constrained))
                    runs["schema" if constrained else "free"].append(rate)
                    if constrained:
                        step_ms = 1000 * clock.step_s / clock.steps
                        grammar_ms = 1000 * clock.grammar_s / clock.steps
            rates = {kind: round(max(rates), 1) for kind, rates in runs.items()}
            cost = 100 * (1 - rates["schema"] / rates["free"])
            share = 100 * grammar_ms / step_ms
            results[f"batch_{batch}"] = {
                **rates,
                "cost_percent": round(cost, 1),
                "step_ms": round(step_ms, 2),
                "grammar_ms_per_step": round(grammar_ms, 3),
                "grammar_share_percent": round(share, 1),
            }
            print(
                f"batch {batch}: {rates['free']} tok/s free, {rates['schema']} tok/s with a "
                f"schema ({cost:.1f}% cost); grammar work {grammar_ms:.2f} ms of a "
                f"{step_ms:.1f} ms step ({share:.1f}%)",
                flush=True,
            )
    finally:
        engine.stop()
    print(json.dumps(results, indent=2))
    if args.json:
        with open(args.json, "w") as out:
            json.dump(results, out, indent=2)


if __name__ == "__main__":
    main()
