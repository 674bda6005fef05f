"""One matrix in each of the CPU's weight formats at several row counts: bf16 panels (oneDNN above
128 rows), int8 rows, and a GGUF's Q4_K, Q5_K, Q6_K, Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0 blocks on
our group kernel (random blocks of the given shape). Several copies are cycled so that the
weights come from memory, as a decode step's do, not from the cache.

    python benchmarks/group_kernel.py --shape 8960x1536 --rows 1,4,16,64,128,512
    python benchmarks/group_kernel.py --shape 9728x896 --formats int8,q5_0,q8_0

Each figure is ms a call, the median and the fastest of `--runs` rounds over the copies; on a
shared machine read them with the load average printed beside them. `--cpu-time` runs one
thread and counts its CPU time instead of the wall clock: what the kernel costs, untouched by
other programs taking the core (their share of the memory's bandwidth still counts). Needs our
CPU kernels.

    python benchmarks/group_kernel.py --library A.so --library B.so --formats q4k,q6k

compares builds of the kernels (`kernel_builds.py`): every round runs each library in a process
of its own, in turn, and the table gives each one's median ms a call.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from kernel_builds import compare
from semantic.backends.torch.blocks import FlatWeight, GroupLinear, GroupWeight
from semantic.backends.torch.kernels import CpuKernels, _import, cpu_kernels, unavailable_reason
from semantic.backends.torch.linear import Int8Linear, Linear, PanelLinear, UnpackScratch
from semantic.models import q4k, q6k, q32

Make = Callable[[int, int, int, CpuKernels], Linear]


def random_blocks(n: int, k: int, seed: int, block_bytes: int) -> np.ndarray:
    """A K-quant tensor's bytes, every bit random but its fp16 d (and dmin): finite, small."""
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, (n * k // q4k.SUPER, block_bytes), dtype=np.uint8)
    scales = rng.uniform(1e-4, 1e-3, (blocks.shape[0], 2)).astype(np.float16).view(np.uint8)
    if block_bytes in (q4k.BLOCK_BYTES, q4k.Q5K_BLOCK_BYTES):
        blocks[:, :4] = scales  # d, dmin first
    else:
        blocks[:, -2:] = scales[:, :2]  # Q6_K: d last
    return blocks.reshape(-1)


def q4k_linear(n: int, k: int, seed: int, kernels: CpuKernels) -> Linear:
    blocks = q4k.read_q4k(random_blocks(n, k, seed, q4k.BLOCK_BYTES), n, k)
    return GroupLinear(GroupWeight.from_q4k(blocks), None, kernels)


def q5k_linear(n: int, k: int, seed: int, kernels: CpuKernels) -> Linear:
    blocks = q4k.read_q5k(random_blocks(n, k, seed, q4k.Q5K_BLOCK_BYTES), n, k)
    return GroupLinear(GroupWeight.from_q4k(blocks), None, kernels)


def q6k_linear(n: int, k: int, seed: int, kernels: CpuKernels) -> Linear:
    blocks = q6k.read_q6k(random_blocks(n, k, seed, q6k.BLOCK_BYTES), n, k)
    return GroupLinear(GroupWeight.from_q6k(blocks), None, kernels)


# bytes a block of 32 and where its fp16 factors lie (d, then m for the `_1` types)
Q32_BLOCK_BYTES = {"Q4_0": 18, "Q4_1": 20, "Q5_0": 22, "Q5_1": 24, "Q8_0": 34}


def random_q32(kind: str, n: int, k: int, seed: int) -> q32.Q32Blocks:
    """A per-32 tensor's blocks, every bit random but its fp16 d (and m): finite, small."""
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, (n * k // q32.GROUP, Q32_BLOCK_BYTES[kind]), dtype=np.uint8)
    factors = 2 if kind.endswith("_1") else 1
    scales = rng.uniform(-1e-3, 1e-3, (blocks.shape[0], factors)).astype(np.float16)
    blocks[:, : 2 * factors] = scales.view(np.uint8)
    return q32.READERS[kind](blocks.reshape(-1), n, k)


def q32_format(kind: str) -> Make:
    def make(n: int, k: int, seed: int, kernels: CpuKernels) -> Linear:
        return GroupLinear(FlatWeight.from_blocks(random_q32(kind, n, k, seed)), None, kernels)

    return make


def dense(n: int, k: int, seed: int) -> torch.Tensor:
    """The Q4_K matrix of `q4k_linear` dequantized, or, where K is no multiple of 256, a Q8_0
    one's."""
    if k % q4k.SUPER:
        return torch.from_numpy(random_q32("Q8_0", n, k, seed).dequantize())
    blocks = q4k.read_q4k(random_blocks(n, k, seed, q4k.BLOCK_BYTES), n, k)
    return torch.from_numpy(blocks.dequantize())


def bf16_linear(n: int, k: int, seed: int, kernels: CpuKernels) -> Linear:
    return PanelLinear(dense(n, k, seed).bfloat16(), None, kernels, UnpackScratch())


def int8_linear(n: int, k: int, seed: int, kernels: CpuKernels) -> Linear:
    return Int8Linear(dense(n, k, seed), None, kernels)


FORMATS: dict[str, Make] = {
    "bf16": bf16_linear,
    "int8": int8_linear,
    "q4k": q4k_linear,
    "q5k": q5k_linear,
    "q6k": q6k_linear,
    **{kind.lower(): q32_format(kind) for kind in Q32_BLOCK_BYTES},
}


def timed(
    linears: list[Linear], x: torch.Tensor, runs: int, clock: Callable[[], float]
) -> tuple[float, float]:
    """ms a call: the median and the fastest round over all copies."""
    for linear in linears:
        linear(x)
    rounds = []
    for _ in range(runs):
        started = clock()
        for linear in linears:
            linear(x)
        rounds.append((clock() - started) / len(linears))
    return 1000 * statistics.median(rounds), 1000 * min(rounds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--shape", default="8960x1536", help="outputs x inputs (in 256s for q4k, q6k; else 32s)"
    )
    parser.add_argument("--rows", default="1,4,16,64,128,512")
    parser.add_argument("--formats", default=",".join(FORMATS))
    parser.add_argument("--copies", type=int, default=4, help="matrices cycled through")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument(
        "--cpu-time", action="store_true", help="one thread, its CPU time (not the wall clock)"
    )
    parser.add_argument(
        "--library", action="append", default=[], help="a kernels build to compare (repeatable)"
    )
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if len(args.library) > 1:
        forwarded = ["--shape", args.shape, "--rows", args.rows, "--formats", args.formats]
        forwarded += ["--copies", str(args.copies), "--runs", "1"]
        forwarded += ["--cpu-time"] if args.cpu_time else []
        compare(__file__, args.library, forwarded, args.runs, "ms a call")
        return
    clock = time.perf_counter
    if args.cpu_time:
        torch.set_num_threads(1)
        clock = time.thread_time
    kernels = CpuKernels(_import(Path(args.library[0]))) if args.library else cpu_kernels()
    if kernels is None:
        raise SystemExit(f"our CPU kernels do not run here: {unavailable_reason()}")
    n, k = (int(v) for v in args.shape.split("x"))
    rows = [int(r) for r in args.rows.split(",")]
    what = "CPU ms" if args.cpu_time else "ms"
    if not args.json:
        print(
            f"{n}x{k}, torch {torch.__version__}, {torch.get_num_threads()} threads; {what} a call"
        )
        print("| format | " + " | ".join(f"{r} rows" for r in rows) + " | load |")
        print("|---" * (len(rows) + 2) + "|")
    medians: dict[str, float] = {}
    with torch.inference_mode():
        for name in args.formats.split(","):
            linears = [FORMATS[name](n, k, seed, kernels) for seed in range(args.copies)]
            cells = []
            for r in rows:
                median, best = timed(linears, torch.randn(r, k).bfloat16(), args.runs, clock)
                medians[f"{name} {n}x{k}, {r} rows"] = median
                cells.append(f"{median:.2f} ({best:.2f})")
            if not args.json:
                print(f"| {name} | " + " | ".join(cells) + f" | {os.getloadavg()[0]:.1f} |")
    if args.json:
        print(json.dumps(medians))


if __name__ == "__main__":
    main()
