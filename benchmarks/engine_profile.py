"""Where the engine's time goes: build the engine as `semantic serve` does (any model, device and
settings), decode requests in-process on this thread under cProfile, and print the decode rate
with and without the profiler and the functions that took the most time.

    python benchmarks/engine_profile.py [--model PATH] [--device cuda] [--requests 1] [--tokens 64]

Decode only: each request's prompt is prefilled before the timed window.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import tempfile
import time

from semantic.commands.loader import build_engine
from semantic.core import Request, SamplingParams, TokenEvent
from semantic.engine.engine import Engine
from semantic.settings.settings import Settings


def decode(engine: Engine, requests: int, tokens: int, prompt: list[int]) -> float:
    """Seconds to decode `tokens` tokens for each of `requests` requests at once."""
    events: list[TokenEvent] = []
    sampling = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True)
    for i in range(requests):
        engine.submit(
            Request(f"profile-{time.monotonic_ns()}-{i}", prompt, sampling), events.append
        )
    engine.step()  # admission and the prompts' prefill (a few hundred tokens fit one step)
    start = time.perf_counter()
    engine.run_until_idle()
    seconds = time.perf_counter() - start
    errors = [event.error for event in events if event.error is not None]
    if errors:
        raise SystemExit(f"a request failed: {errors[0]}")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    parser.add_argument("--requests", type=int, default=1, help="requests decoding at once")
    parser.add_argument("--tokens", type=int, default=64, help="tokens each request decodes")
    parser.add_argument("--prompt-tokens", type=int, default=200)
    parser.add_argument("--top", type=int, default=30, help="functions to list")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as cache_dir:
        settings = Settings(model=args.model, device=args.device, cache_dir=cache_dir)
        engine = build_engine(settings)
        prompt = list(range(1000, 1000 + args.prompt_tokens))
        decode(engine, args.requests, 4, prompt)  # warm-up
        plain = decode(engine, args.requests, args.tokens, prompt)
        profile = cProfile.Profile()
        profile.enable()
        profiled = decode(engine, args.requests, args.tokens, prompt)
        profile.disable()
        engine.stop()
    total = args.requests * args.tokens
    print(
        f"{args.requests} request(s) x {args.tokens} tokens: {total / plain:.1f} tok/s, "
        f"{1000 * plain / args.tokens:.2f} ms a step ({total / profiled:.1f} tok/s profiled)"
    )
    stats = pstats.Stats(profile)
    stats.sort_stats("tottime").print_stats(args.top)
    stats.sort_stats("cumulative").print_stats(args.top)


if __name__ == "__main__":
    main()
