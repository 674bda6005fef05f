"""Decode attention alone, bf16 K/V against int8 K/V with per-row scales: our CPU kernel over one
layer of SmolLM2's shape (9 query heads, 3 KV heads, head_dim 64, blocks of 256) or
Qwen2.5-Coder-1.5B's (12, 2, 128), for 1 and 8 sequences at several context lengths, the two
interleaved; each call reads K/V cold from memory
(layers of pools larger than the caches together, walked in turn), as in a real step of 30
layers. Reports each kind's fastest run (on a shared machine the least disturbed) and median.

    python benchmarks/kv_decode_kernel.py [--contexts 1000,4000,10000] [--runs 15]
    python benchmarks/kv_decode_kernel.py --shape qwen2.5-coder-1.5b --contexts 2771,16000
    python benchmarks/kv_decode_kernel.py --library A.so --library B.so --runs 5 --rounds 11

The last compares builds of the kernels (`kernel_builds.py`): each round runs each library in a
process of its own, in turn, and the table gives each one's median of the rounds' fastest.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch

from kernel_builds import compare
from semantic.backends.torch.int8 import quantize_rows
from semantic.backends.torch.kernels import CpuKernels, _import, cpu_kernels

BLOCK = 256
# query heads, KV heads, head_dim, softmax scale
SHAPES = {"smollm2-135m": (9, 3, 64, 0.125), "qwen2.5-coder-1.5b": (12, 2, 128, 0.088)}
COLD_BYTES = 96 * 2**20  # bf16 K/V of the layers walked in turn: well past the L3 cache


def pools(
    batch: int, context: int, kv_heads: int, dim: int
) -> tuple[list[tuple[torch.Tensor, ...]], torch.Tensor]:
    per_seq = -(-context // BLOCK)
    shape = (batch * per_seq, BLOCK, kv_heads, dim)
    count = min(64, max(4, COLD_BYTES // (4 * batch * per_seq * BLOCK * kv_heads * dim)))
    layers: list[tuple[torch.Tensor, ...]] = []
    for _ in range(count):
        k, v = torch.randn(shape), torch.randn(shape)
        (k8, ks), (v8, vs) = quantize_rows(k), quantize_rows(v)
        layers.append((k.bfloat16(), v.bfloat16(), k8, v8, ks, vs))
    tables = torch.arange(batch * per_seq, dtype=torch.int64).view(batch, per_seq)
    return layers, tables


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--contexts", default="1000,4000,10000")
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="smollm2-135m")
    parser.add_argument(
        "--library", action="append", default=[], help="a kernels build to compare (repeatable)"
    )
    parser.add_argument("--rounds", type=int, default=11, help="of each library, in turn")
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if len(args.library) > 1:
        forwarded = ["--contexts", args.contexts, "--runs", str(args.runs), "--shape", args.shape]
        compare(__file__, args.library, forwarded, args.rounds, "µs a layer (fastest of its runs)")
        return
    heads, kv_heads, dim, scale = SHAPES[args.shape]
    kernels = CpuKernels(_import(Path(args.library[0]))) if args.library else cpu_kernels()
    if kernels is None:
        raise SystemExit("needs our CPU kernels")
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    threads = torch.get_num_threads()
    if not args.json:
        print(
            f"torch {torch.__version__}, {threads} threads, {args.shape}, load {load}; µs a layer"
        )
    fastest: dict[str, float] = {}
    for context in (int(c) for c in args.contexts.split(",")):
        for batch in (1, 8):
            layers, tables = pools(batch, context, kv_heads, dim)
            lens = torch.full((batch,), context, dtype=torch.int64)
            q = torch.randn(batch, heads, dim).bfloat16()
            times: dict[str, list[float]] = {"bf16": [], "int8": []}
            for _ in range(args.runs):  # interleaved: both see the same noise
                for kind in times:
                    start = time.perf_counter()
                    for k, v, k8, v8, ks, vs in layers:
                        if kind == "bf16":
                            kernels.decode_attention(q, k, v, tables, lens, scale)
                        else:
                            kernels.decode_attention(
                                q, k8, v8, tables, lens, scale, None, None, ks, vs
                            )
                    times[kind].append((time.perf_counter() - start) / len(layers) * 1e6)
            fast = {kind: min(runs) for kind, runs in times.items()}
            mid = {kind: statistics.median(runs) for kind, runs in times.items()}
            for kind, figure in fast.items():
                fastest[f"{kind}, {context} keys, {batch} sequences"] = figure
            if args.json:
                continue
            print(
                f"context {context:6d}, {batch} sequences: fastest bf16 {fast['bf16']:7.0f} µs, "
                f"int8 {fast['int8']:7.0f} µs, int8/bf16 {fast['int8'] / fast['bf16']:.2f}; "
                f"median {mid['bf16']:.0f} / {mid['int8']:.0f} µs"
            )
    if args.json:
        print(json.dumps(fastest))


if __name__ == "__main__":
    main()
