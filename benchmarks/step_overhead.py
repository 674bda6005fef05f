"""The engine's bookkeeping per decode step, in CPU time: `Scheduler.schedule` + `update` of N
decoding sequences, and `build_step` of their batch (the CPU kernels' inputs, and the stock
path's, which also builds masks), for a model with one layer group (SmolLM2's layout) and a
hybrid one (Gemma 3 270M's: one full-attention group and five sliding groups of 512 tokens).

    python benchmarks/step_overhead.py [--sequences 8] [--context 1000] [--steps 300]

CPU time (`time.process_time`) on one thread, medians of 7 rounds: other processes on a shared
machine do not count, as they would in wall time. A decode step of SmolLM2 computes for ~13 ms
(one sequence) to ~30 ms (eight): these are the microseconds around it.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from semantic.backends.torch.runner import build_step
from semantic.cache.pages.block_pool import BlockPool
from semantic.cache.pages.prefix import PrefixCache, root_hash
from semantic.core import Batch, CacheSpec, Request, SamplingParams, Sequence
from semantic.engine.scheduler import Scheduler

BLOCK_TOKENS = 256
CHUNK = 512  # the default max_batch_tokens
LAYOUTS = {
    "one group (SmolLM2)": CacheSpec(30, 3, 64, "bfloat16", BLOCK_TOKENS),
    "six groups (Gemma 3 270M)": CacheSpec(
        18, 1, 256, "bfloat16", BLOCK_TOKENS, ((512,) * 5 + (None,)) * 3
    ),
}


def cpu_us(run: Callable[[], object], repeats: int) -> float:
    """Median CPU microseconds of one `run`, over 7 rounds of `repeats`."""
    rounds = []
    for _ in range(7):
        start = time.process_time()
        for _ in range(repeats):
            run()
        rounds.append((time.process_time() - start) / repeats * 1e6)
    return statistics.median(rounds)


def decoding(spec: CacheSpec, sequences: int, context: int) -> Scheduler:
    """A scheduler whose `sequences` sequences have prefilled `context` tokens and decode."""
    prefix = PrefixCache(
        BlockPool(4096), BLOCK_TOKENS, root_hash("bench"), group_windows=spec.group_windows
    )
    scheduler = Scheduler(prefix, block_tokens=BLOCK_TOKENS, max_running=64, max_batch_tokens=CHUNK)
    seqs = []
    for i in range(sequences):
        prompt = [(i * 7 + k) % 1000 for k in range(context)]
        request = Request(f"r{i}", prompt, SamplingParams(temperature=0.0, max_tokens=10**6))
        seqs.append(Sequence(i, request, list(prompt), len(prompt)))
        scheduler.add(seqs[-1])
    while scheduler.waiting or any(seq.in_prefill for seq in seqs):
        batch = scheduler.schedule()
        scheduler.update(batch, [1 if item.sample else None for item in batch.items])
    return scheduler


def measure(spec: CacheSpec, sequences: int, context: int, steps: int) -> dict[str, float]:
    scheduler = decoding(spec, sequences, context)

    def step() -> Batch:
        batch = scheduler.schedule()
        scheduler.update(batch, [1] * len(batch.items))
        return batch

    bookkeeping = cpu_us(step, steps)
    batch = step()
    cpu, windows = torch.device("cpu"), spec.group_windows
    return {
        "schedule + update": bookkeeping,
        "build_step, CPU kernels": cpu_us(
            lambda: build_step(batch, BLOCK_TOKENS, cpu, masks=False, group_windows=windows),
            steps,
        ),
        "build_step, stock path": cpu_us(
            lambda: build_step(batch, BLOCK_TOKENS, cpu, group_windows=windows), steps
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sequences", type=int, default=8)
    parser.add_argument("--context", type=int, default=1000)
    parser.add_argument("--steps", type=int, default=300)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"{args.sequences} sequences decoding at {args.context} tokens; CPU µs per step")
    for name, spec in LAYOUTS.items():
        figures = measure(spec, args.sequences, args.context, args.steps)
        print(f"{name}: " + ", ".join(f"{k} {v:.1f}" for k, v in figures.items()))


if __name__ == "__main__":
    main()
