"""Single-stream decode on a quiet and on a busy machine, under each way the compute threads may
wait for each other: OpenMP's default (spin a while, then sleep), passive (sleep at once), a
short spin, one thread, or the server's way (as many threads as the other programs leave cores,
`backends/torch/threads.py`).

    python benchmarks/thread_wait.py [--rounds 3] [--loads quiet,spin2,torch1] [--steps 32]

Each configuration runs in its own process (OpenMP reads its wait policy when torch loads), on
the real SmolLM2 weights with our CPU kernels, decoding after a 200-token prompt. The loads run
beside it at normal priority: `spinN` is N processes spinning in pure Python (a compiler, say),
`torchN` is N processes multiplying matrices with torch on every core, with OpenMP's default
wait (another torch program, or a second server prefilling). Configurations take turns within
each round, and each cell is the median over the rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

# name: (environment, whether the thread count follows the load as the server's does)
CONFIGS: dict[str, tuple[dict[str, str], bool]] = {
    "2 threads": ({}, False),  # OpenMP's default wait: spin ~3 ms, then sleep
    "passive": ({"OMP_WAIT_POLICY": "PASSIVE"}, False),
    "spin 1k": ({"GOMP_SPINCOUNT": "1000"}, False),
    "threads 1": ({"OMP_NUM_THREADS": "1"}, False),
    "following the load (ours)": ({}, True),
}
PROMPT_TOKENS = 200


def child(steps: int, governed: bool) -> None:
    """Decode `steps` tokens three times after one prompt; print the median window's tok/s."""
    from semantic.backends.torch.runner import TorchRunner
    from semantic.core import Batch, BatchItem, SamplingParams
    from semantic.models.checkpoint import load_checkpoint
    from semantic.models.registry import ModelRegistry

    checkpoint = load_checkpoint(ModelRegistry().resolve("smollm2-135m").path, progress=False)
    runner = TorchRunner(
        checkpoint.config, checkpoint.weights(), block_tokens=256, cache_budget_mb=64
    )
    if not governed:
        runner.threads = None
    greedy = SamplingParams(temperature=0.0)
    table = [list(range(runner.num_blocks))]
    prompt = [(i * 7919) % 20_000 + 100 for i in range(PROMPT_TOKENS)]
    (token,) = runner.run(Batch([BatchItem(0, prompt, 0, table, True, greedy, 0)]))
    length = PROMPT_TOKENS
    rates = []
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(steps):
            item = BatchItem(
                0, [token if isinstance(token, int) else 0], length, table, True, greedy, 1
            )
            (token,) = runner.run(Batch([item]))
            length += 1
        rates.append(steps / (time.perf_counter() - start))
    print(json.dumps({"tok_s": statistics.median(rates)}))


def measure(config: tuple[dict[str, str], bool], steps: int) -> float:
    variables, governed = config
    env = {**_without_openmp_settings(), **variables}
    command = [sys.executable, __file__, "--child", "--steps", str(steps)]
    command += ["--governed"] if governed else []
    out = subprocess.run(command, env=env, capture_output=True, text=True, check=True).stdout
    return float(json.loads(out.strip().splitlines()[-1])["tok_s"])


def start_load(load: str) -> list[subprocess.Popen[bytes]]:
    kind, count = load.rstrip("0123456789"), int(load.lstrip("abcdefghijklmnopqrstuvwxyz") or 0)
    if kind == "spin":
        command = [sys.executable, "-c", "while True: pass"]
    elif kind == "torch":
        rival = "import torch; a = torch.randn(1024, 1024)\nwhile True: a @ a"
        command = [sys.executable, "-c", rival]
    else:
        return []
    started = [
        subprocess.Popen(command, env=_without_openmp_settings(), stdout=subprocess.DEVNULL)
        for _ in range(count)
    ]
    time.sleep(3)  # under way before the first measurement
    return started


def _without_openmp_settings() -> dict[str, str]:
    openmp = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OMP_NUM_THREADS")
    return {k: v for k, v in os.environ.items() if k not in openmp}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--loads", default="quiet,spin2,torch1", help="what runs beside it")
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--governed", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.steps, args.governed)
        return
    loads = args.loads.split(",")
    results: dict[tuple[str, str], list[float]] = {}
    for busy in loads:
        load = start_load(busy)
        try:
            for _ in range(args.rounds):
                for name, config in CONFIGS.items():
                    rate = measure(config, args.steps)
                    results.setdefault((busy, name), []).append(rate)
                    print(f"{busy}, {name}: {rate:.1f} tok/s", file=sys.stderr)
        finally:
            for process in load:
                process.kill()
    print(f"\nsingle-stream decode tok/s, median of {args.rounds} (cpus: {os.cpu_count()})\n")
    print("| beside it | " + " | ".join(CONFIGS) + " |")
    print("|---" * (len(CONFIGS) + 1) + "|")
    for busy in loads:
        cells = [f"{statistics.median(results[(busy, name)]):.1f}" for name in CONFIGS]
        print(f"| {busy} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
