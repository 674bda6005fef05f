"""Paged attention on CUDA, one layer: our Triton kernels (`cuda/attention.py`) beside the stock
path (gather the blocks, then SDPA), for decode at batch 1 and 32 with 1K and 4K tokens of
context and for prefill of 1,000 tokens and of 100 new tokens after 900 cached, at SmolLM2's
shape (9 heads, 3 KV heads, head_dim 64) and Llama 3.2 1B's (32 heads, 8 KV heads, head_dim 64),
blocks of 256 tokens, bf16 (and decode at batch 32 and 4K from an 8-bit pool). Each case
checks the two agree, then times each kernel with CUDA events after warm-up (the GPU is first
kept busy for `--warm-seconds`, so its clocks are up), and prints one table: median ms per
call, the speedup, the largest difference, and what the Triton kernel reaches (decode: GB/s of
K/V read; prefill: TFLOP/s of the causal products).
Decode cycles through enough layers' pools that K/V come from HBM, not L2, as in a real step.

    python benchmarks/cuda_attention.py [--runs 50] [--warmup 10] [--warm-seconds 2]
    python benchmarks/cuda_attention.py --device cpu --quick   # tiny, in Triton's interpreter

On the CPU (`--device cpu`) the kernels run in Triton's interpreter in fp32 (it has no bf16):
that proves the script runs, not how fast anything is.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from semantic.backends.torch.cuda.graphs import record_graph
from semantic.backends.torch.int8 import quantize_rows

BLOCK_TOKENS = 256
SHAPES = {"SmolLM2": (9, 3, 64), "1B": (32, 8, 64)}  # heads, KV heads, head_dim
COLD_BYTES = 256 * 2**20  # K/V of the layers cycled through: well past an H100's 50 MB of L2


@dataclass(frozen=True)
class Case:
    """One row of the table: a decode of `batch` sequences at `context` tokens, or a prefill of
    `new` tokens after `context` cached (batch 1)."""

    kind: str
    shape: str
    batch: int
    context: int
    new: int = 1
    int8: bool = False  # an 8-bit pool: int8 K/V with a bf16 scale per row

    def label(self) -> str:
        pool = ", int8" if self.int8 else ""
        if self.kind == "decode":
            return f"decode B={self.batch} ctx={self.context}{pool}"
        return f"prefill {self.new} after {self.context}{pool}"


def cases(quick: bool) -> list[Case]:
    if quick:
        return [
            Case("decode", "SmolLM2", 1, 300),
            Case("decode", "SmolLM2", 4, 100),
            Case("decode", "SmolLM2", 2, 100, int8=True),
            Case("prefill", "SmolLM2", 1, 0, 40),
            Case("prefill", "SmolLM2", 1, 30, 10),
        ]
    rows = []
    for shape in SHAPES:
        rows += [Case("decode", shape, b, c) for b in (1, 32) for c in (1024, 4096)]
        rows.append(Case("decode", shape, 32, 4096, int8=True))
        rows += [Case("prefill", shape, 1, 0, 1000), Case("prefill", shape, 1, 900, 100)]
    return rows


class Layers:
    """Copies of one layer's K/V pool, each sequence's blocks scattered in it; `next()` cycles
    through them so each call reads K/V that the calls before it have not left in cache."""

    def __init__(self, case: Case, dtype: torch.dtype, device: str) -> None:
        _, kv_heads, dim = SHAPES[case.shape]
        keys = case.context + (case.new if case.kind == "prefill" else 0)
        per_seq = -(-keys // BLOCK_TOKENS)
        pages = case.batch * per_seq
        row_bytes = dim + 2 if case.int8 else dim * dtype.itemsize  # int8: and its scale
        page_bytes = 2 * BLOCK_TOKENS * kv_heads * row_bytes
        count = 1 if device == "cpu" else max(1, min(64, COLD_BYTES // (pages * page_bytes)))
        shape = (pages, BLOCK_TOKENS, kv_heads, dim)
        self.kv = [LayerCopy.random(shape, dtype, device, case.int8) for _ in range(count)]
        self.tables = torch.randperm(pages, device=device).view(case.batch, per_seq)
        self.bytes_read = case.batch * case.context * 2 * kv_heads * row_bytes
        self.index = 0

    def next(self) -> int:
        self.index = (self.index + 1) % len(self.kv)
        return self.index


@dataclass(frozen=True)
class LayerCopy:
    """One copy of a layer's K and V pool tensors, and an 8-bit pool's row scales."""

    k: torch.Tensor
    v: torch.Tensor
    scales: tuple[torch.Tensor, torch.Tensor] | None

    @classmethod
    def random(
        cls, shape: tuple[int, ...], dtype: torch.dtype, device: str, int8: bool
    ) -> LayerCopy:
        k, v = (torch.randn(shape, device=device).to(dtype) for _ in range(2))
        if not int8:
            return cls(k, v, None)
        (k8, k_scales), (v8, v_scales) = quantize_rows(k), quantize_rows(v)
        return cls(k8, v8, (k_scales, v_scales))

    def scale_args(self) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        return (None, None) if self.scales is None else self.scales


def median_ms(call: Callable[[], object], runs: int, warmup: int, device: str) -> float:
    for _ in range(warmup):
        call()
    if device == "cpu":
        times = []
        for _ in range(runs):
            start = time.perf_counter()
            call()
            times.append((time.perf_counter() - start) * 1e3)
        return statistics.median(times)
    events = []
    for _ in range(runs):
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        call()
        end.record()
        events.append((begin, end))
    torch.cuda.synchronize()
    return statistics.median(begin.elapsed_time(end) for begin, end in events)


Attend = Callable[[int], torch.Tensor]  # attends over the K/V of the layer copy it is given


def kernels_for(case: Case, layers: Layers, q: torch.Tensor) -> tuple[Attend, Attend]:
    """(ours, stock): each attends the case's queries over a layer copy's K and V."""
    # Imported here: under `--device cpu` TRITON_INTERPRET is set first.
    from semantic.backends.torch import attention as stock
    from semantic.backends.torch.cuda.attention import TritonAttention

    triton_kernels = TritonAttention()
    scratch = stock.GatherScratch(layers.kv[0].k)  # one for every call, as the pool has

    def layer_kv(i: int) -> stock.LayerKV:
        copy = layers.kv[i]
        return stock.LayerKV(copy.k, copy.v, scratch, None, 0, copy.scales)

    scale = q.shape[-1] ** -0.5
    how = stock.LayerAttention(scale)
    device = q.device
    if case.kind == "decode":
        lens = torch.full((case.batch,), case.context, dtype=torch.int64, device=device)
        group = stock.DecodeGroup(case.batch, case.context, layers.tables, lens, None)

        def ours(i: int) -> torch.Tensor:
            copy = layers.kv[i]
            return triton_kernels.decode_attention(
                q, copy.k, copy.v, layers.tables, lens, scale, None, None, *copy.scale_args()
            )

        def theirs(i: int) -> torch.Tensor:
            return stock.decode_attention(q, layer_kv(i), group, how)

        return ours, theirs
    total, table = case.context + case.new, layers.tables[0]
    chunk = stock.PrefillChunk(0, case.new, 0, None, None)
    if case.context:
        mask = torch.ones(case.new, total, dtype=torch.bool, device=device).tril_(case.context)
        chunk = stock.PrefillChunk(0, case.new, case.context, table, mask)

    # The chunk's own K and V [new, KVH, D] of each copy, as the model has them (16-bit pools).
    own = [
        (
            c.k[table].flatten(0, 1)[case.context : total],
            c.v[table].flatten(0, 1)[case.context : total],
        )
        for c in layers.kv
    ]

    def ours_prefill(i: int) -> torch.Tensor:
        if case.context == 0:
            return triton_kernels.prefill_attention(q, *own[i], None, 0, scale)
        copy = layers.kv[i]
        return triton_kernels.prefill_attention(
            q, copy.k, copy.v, table, case.context, scale, None, None, *copy.scale_args()
        )

    def theirs_prefill(i: int) -> torch.Tensor:
        return stock.prefill_attention(q, *own[i], layer_kv(i), chunk, how)

    return ours_prefill, theirs_prefill


def run_case(case: Case, args: argparse.Namespace, dtype: torch.dtype) -> dict[str, float]:
    heads, _, dim = SHAPES[case.shape]
    layers = Layers(case, dtype, args.device)
    q = torch.randn(case.batch * case.new, heads, dim, device=args.device).to(dtype)
    ours, theirs = kernels_for(case, layers, q)
    difference = (ours(0).float() - theirs(0).float()).abs().max().item()
    ours_ms = median_ms(lambda: ours(layers.next()), args.runs, args.warmup, args.device)
    theirs_ms = median_ms(lambda: theirs(layers.next()), args.runs, args.warmup, args.device)
    row = {"stock": theirs_ms, "triton": ours_ms, "difference": difference}
    if case.kind == "decode":
        if args.device == "cuda":  # a decode step's layers run as one CUDA graph
            row["graph stock"] = graph_ms(theirs, len(layers.kv), args.runs)
            row["graph triton"] = ours_ms = graph_ms(ours, len(layers.kv), args.runs)
        row["rate"] = layers.bytes_read / (ours_ms * 1e-3) / 1e9
    else:
        pairs = case.new * case.context + case.new * (case.new + 1) / 2
        row["rate"] = 4 * heads * dim * pairs / (ours_ms * 1e-3) / 1e12
    return row


def graph_ms(call: Attend, count: int, runs: int) -> float:
    """ms per call of `count` calls, one per layer copy, captured in one CUDA graph as a decode
    step's layers are and replayed: the GPU's time without Python's launch costs."""

    def all_layers() -> None:
        for i in range(count):
            call(i)

    graph, _ = record_graph(all_layers)
    return median_ms(graph.replay, runs, 3, "cuda") / count


def warm_gpu(seconds: float) -> None:
    """Keep the GPU busy so its clocks are up before anything is timed."""
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        for _ in range(20):
            a @ a
        torch.cuda.synchronize()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--quick", action="store_true", help="tiny cases (for --device cpu)")
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--warm-seconds", type=float, default=2.0)
    args = parser.parse_args()
    if args.device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"
        args.runs, args.warmup = min(args.runs, 3), min(args.warmup, 1)
        dtype = torch.float32
    else:
        dtype = torch.bfloat16
        print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
        warm_gpu(args.warm_seconds)
    print(f"one layer, {dtype}, blocks of {BLOCK_TOKENS}; median ms of {args.runs} calls")
    print("eager: calls launched one by one; graph: decode's layers replayed as one CUDA graph")
    print("speedup: stock / triton, in graphs where there are graphs; rate: triton's")
    columns = ("stock", "triton", "graph stock", "graph triton")
    header = " ".join(f"{name:>12}" for name in columns)
    print(f"{'shape':8} {'case':26} {header} {'speedup':>8} {'max diff':>9} {'rate':>16}")
    for case in cases(args.quick):
        row = run_case(case, args, dtype)
        times = " ".join(f"{row[name]:12.4f}" if name in row else f"{'-':>12}" for name in columns)
        graphed = "graph triton" in row
        speedup = (
            row["graph stock"] / row["graph triton"] if graphed else row["stock"] / row["triton"]
        )
        unit = "GB/s" if case.kind == "decode" else "TFLOP/s"
        print(
            f"{case.shape:8} {case.label():26} {times} {speedup:7.2f}x "
            f"{row['difference']:9.2e} {row['rate']:8.2f} {unit}"
        )


if __name__ == "__main__":
    main()
