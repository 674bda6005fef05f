"""A layer's small ops on CUDA, our Triton kernels (`backends/torch/cuda/layers.py`) against the
stock torch ops the model layers run without them (`--no-cpu-kernels`), for the SmolLM2 shape
(hidden 576, 9 heads, 3 KV heads, head_dim 64, intermediate 1536) in bf16, at decode (T = 1,
32) and prefill (T = 512).

    python benchmarks/cuda_layers.py [--tokens 1,32,512] [--kv int8|bf16]
    python benchmarks/cuda_layers.py --device cpu --quick    # the interpreter: a dry run

Per op and way, one table row: microseconds a call eager (CUDA events around a loop of calls
after warm-up: what a step pays while the CPU launches kernels one by one), microseconds a call
replayed from a CUDA graph (the GPU's own time, with no launch cost), and the kernel launches a
call makes (counted by torch.profiler on CUDA). "layer" is every small op of one decoder layer
together: the residual adds and both RMSNorms, rope, the K/V write, SwiGLU's middle (not the
matmuls, not attention). With `--device cpu` the kernels run in Triton's interpreter and the
launches are counted as the aten ops that compute plus the Triton launches: it only checks
that the script runs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

HIDDEN, HEADS, KV_HEADS, DIM, INTER = 576, 9, 3, 64, 1536
EPS = 1e-5
BLOCK_TOKENS = 256


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tokens", default="1,32,512", help="T per call, comma-separated")
    parser.add_argument("--kv", choices=["int8", "bf16"], default="bf16", help="the pool's kind")
    parser.add_argument("--calls", type=int, default=100, help="calls per timed loop")
    parser.add_argument("--quick", action="store_true", help="T = 1, 4 and a few calls")
    return parser


# Off a GPU the kernels run in Triton's interpreter, which must be chosen before Triton loads.
if torch.device(_parser().parse_known_args()[0].device).type != "cuda":
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch.nn.functional as F  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from semantic.backends.torch.attention import GatherScratch, LayerKV, write_kv  # noqa: E402
from semantic.backends.torch.cuda import layers as cuda_layers  # noqa: E402
from semantic.backends.torch.cuda.graphs import record_graph  # noqa: E402
from semantic.backends.torch.models.layers import QKNorms, RMSNorm  # noqa: E402
from semantic.backends.torch.models.rope import Rope, apply_rope  # noqa: E402

LAYERS = cuda_layers.TritonLayers()
Op = Callable[["Inputs"], object]


@dataclass
class Inputs:
    """One layer's tensors at T tokens: the residual stream and a sublayer's output, the fused
    QKV projection's output, the step's rope tables and slots, the pool, gate-up's output."""

    x: torch.Tensor
    delta: torch.Tensor
    norm: RMSNorm
    head_norm: RMSNorm  # a q/k norm (Qwen3), over head_dim
    qkv: torch.Tensor
    cos: torch.Tensor
    sin_signed: torch.Tensor
    slots: torch.Tensor
    kv: LayerKV
    gate_up: torch.Tensor

    @classmethod
    def make(cls, tokens: int, device: torch.device, dtype: torch.dtype, kv: str) -> Inputs:
        def rand(*shape: int) -> torch.Tensor:
            return torch.randn(shape, device=device).to(dtype)

        pages = -(-tokens // BLOCK_TOKENS) + 1
        shape = (pages, BLOCK_TOKENS, KV_HEADS, DIM)
        pool_dtype = torch.int8 if kv == "int8" else dtype
        k = torch.zeros(shape, dtype=pool_dtype, device=device)
        v = torch.zeros_like(k)
        scales = None
        if kv == "int8":
            k_scales = torch.zeros(shape[:3], dtype=torch.bfloat16, device=device)
            scales = k_scales, torch.zeros_like(k_scales)
        rope = Rope(DIM, 100000.0, None, device)
        cos, sin_signed = rope.tables(torch.arange(tokens, device=device) + 1000, dtype)
        return cls(
            x=rand(tokens, HIDDEN),
            delta=rand(tokens, HIDDEN) * 1e-3,
            norm=RMSNorm(rand(HIDDEN), EPS, None),
            head_norm=RMSNorm(rand(DIM), EPS, None),
            qkv=rand(tokens, HEADS + 2 * KV_HEADS, DIM),
            cos=cos,
            sin_signed=sin_signed,
            slots=torch.randperm(pages * BLOCK_TOKENS, device=device)[:tokens],
            kv=LayerKV(k, v, GatherScratch(k), scales=scales),
            gate_up=rand(tokens, 2 * INTER),
        )


# ---- the stock ops (the model layers' torch path) ----


def stock_add_rms_norm(t: Inputs) -> torch.Tensor:
    t.x += t.delta
    return t.norm(t.x)


def stock_rope(t: Inputs) -> torch.Tensor:
    return apply_rope(t.qkv[:, : HEADS + KV_HEADS], t.cos, t.sin_signed)


def stock_write_kv(t: Inputs) -> None:
    write_kv(t.kv, t.qkv[:, HEADS : HEADS + KV_HEADS], t.qkv[:, HEADS + KV_HEADS :], t.slots)


def stock_rope_write_kv(t: Inputs) -> None:
    qk = stock_rope(t)
    write_kv(t.kv, qk[:, HEADS:], t.qkv[:, HEADS + KV_HEADS :], t.slots)


def stock_norm_rope_write_kv(t: Inputs) -> None:
    """Qwen3's attention front: each q and k head's RMSNorm, then rope, then the write."""
    heads = t.qkv[:, : HEADS + KV_HEADS]
    normed = torch.cat([t.head_norm(heads[:, :HEADS]), t.head_norm(heads[:, HEADS:])], 1)
    qk = apply_rope(normed, t.cos, t.sin_signed)
    write_kv(t.kv, qk[:, HEADS:], t.qkv[:, HEADS + KV_HEADS :], t.slots)


def stock_swiglu(t: Inputs) -> torch.Tensor:
    gate, up = t.gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def stock_layer(t: Inputs) -> None:
    stock_add_rms_norm(t)  # the last layer's MLP residual, this layer's attention norm
    stock_rope_write_kv(t)
    stock_add_rms_norm(t)  # the attention residual, the MLP norm
    stock_swiglu(t)


# ---- ours ----


def our_add_rms_norm(t: Inputs) -> torch.Tensor:
    return LAYERS.add_rms_norm(t.x, t.delta, t.norm.weight, EPS)


def our_write_kv(t: Inputs) -> None:
    kv = t.kv
    LAYERS.write_kv(t.qkv[:, HEADS : HEADS + KV_HEADS], t.slots, kv.k, kv.k_scales)
    LAYERS.write_kv(t.qkv[:, HEADS + KV_HEADS :], t.slots, kv.v, kv.v_scales)


def our_rope_write_kv(t: Inputs) -> None:
    kv = t.kv
    LAYERS.rope_write_kv(
        t.qkv, HEADS, KV_HEADS, t.cos, t.sin_signed, t.slots, kv.k, kv.v, kv.k_scales, kv.v_scales
    )


def our_norm_rope_write_kv(t: Inputs) -> None:
    kv, weight = t.kv, t.head_norm.weight
    LAYERS.rope_write_kv(
        t.qkv,
        HEADS,
        KV_HEADS,
        t.cos,
        t.sin_signed,
        t.slots,
        kv.k,
        kv.v,
        kv.k_scales,
        kv.v_scales,
        QKNorms(weight, weight, EPS, True),
    )


def our_layer(t: Inputs) -> None:
    our_add_rms_norm(t)
    our_rope_write_kv(t)
    our_add_rms_norm(t)
    LAYERS.swiglu(t.gate_up)


OPS: dict[str, tuple[Op, Op]] = {
    "rms_norm": (lambda t: t.norm(t.x), lambda t: LAYERS.rms_norm(t.x, t.norm.weight, EPS)),
    "add + rms_norm": (stock_add_rms_norm, our_add_rms_norm),
    "rope q, k": (
        stock_rope,
        lambda t: LAYERS.rope(t.qkv[:, : HEADS + KV_HEADS], t.cos, t.sin_signed),
    ),
    "write k, v": (stock_write_kv, our_write_kv),
    "rope + write k, v": (stock_rope_write_kv, our_rope_write_kv),
    "qk norms+rope+write": (stock_norm_rope_write_kv, our_norm_rope_write_kv),
    "swiglu": (stock_swiglu, lambda t: LAYERS.swiglu(t.gate_up)),
    "layer": (stock_layer, our_layer),
}


# ---- timing and counting ----


def eager_us(op: Op, t: Inputs, calls: int) -> float:
    """Microseconds a call, a loop of `calls` after warm-up; the median of 5 loops."""
    for _ in range(3):
        op(t)
    loops = []
    for _ in range(5):
        if t.x.is_cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(calls):
                op(t)
            end.record()
            end.synchronize()
            loops.append(start.elapsed_time(end) * 1e3 / calls)
        else:
            began = time.perf_counter()
            for _ in range(calls):
                op(t)
            loops.append((time.perf_counter() - began) * 1e6 / calls)
    return statistics.median(loops)


def graph_us(op: Op, t: Inputs, calls: int) -> float:
    """Microseconds a call replayed from a CUDA graph of `calls` calls; the median of 5."""

    def all_calls() -> None:
        for _ in range(calls):
            op(t)

    graph, _ = record_graph(all_calls, warmups=3)
    graph.replay()
    replays = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        replays.append(start.elapsed_time(end) * 1e3 / calls)
    return statistics.median(replays)


def launches(op: Op, t: Inputs) -> int:
    """Kernel launches of one call: by torch.profiler on CUDA; on the CPU, the aten ops that
    compute (not views, not allocations) plus the Triton launches."""
    if t.x.is_cuda:
        activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
        with torch.profiler.profile(activities=activities) as prof:
            op(t)
            torch.cuda.synchronize()
        cuda = torch.autograd.DeviceType.CUDA
        return sum(1 for event in prof.events() if event.device_type == cuda)
    with _CountOps() as counter, _count_triton(counter):
        op(t)
    return counter.count


class _CountOps(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.count = 0
        self.paused = False  # inside a Triton launch: the interpreter's own torch calls

    def __torch_dispatch__(
        self, func: Any, types: Any, args: Any = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        if not (self.paused or func.is_view or "empty" in func.__name__):
            self.count += 1
        return func(*args, **(kwargs or {}))


class _Counted:
    """A Triton kernel that counts its launches."""

    def __init__(self, kernel: Any, counter: _CountOps) -> None:
        self.kernel, self.counter = kernel, counter

    def __getitem__(self, grid: Any) -> Callable[..., None]:
        launch = self.kernel[grid]

        def run(*args: Any, **kwargs: Any) -> None:
            self.counter.count += 1
            self.counter.paused = True
            try:
                launch(*args, **kwargs)
            finally:
                self.counter.paused = False

        return run


@contextmanager
def _count_triton(counter: _CountOps) -> Iterator[None]:
    names = [name for name in vars(cuda_layers) if name.endswith("_kernel")]
    kernels = {name: getattr(cuda_layers, name) for name in names}
    for name, kernel in kernels.items():
        setattr(cuda_layers, name, _Counted(kernel, counter))
    try:
        yield
    finally:
        for name, kernel in kernels.items():
            setattr(cuda_layers, name, kernel)


def main() -> None:
    args = _parser().parse_args()
    device = torch.device(args.device)
    # bf16 on a GPU; the interpreter cannot hold bf16 tensors, so fp16 there
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float16
    tokens = [1, 4] if args.quick else [int(n) for n in args.tokens.split(",")]
    calls = 2 if args.quick else args.calls
    if device.type == "cuda":
        print(f"# {torch.cuda.get_device_name(device)}, torch {torch.__version__}")
    print(f"# SmolLM2 shape, {dtype}, {args.kv} pool; µs a call (eager / CUDA graph), launches")
    header = f"{'op':<20}{'T':>5}  {'stock eager':>12}{'ours eager':>12}"
    header += f"{'stock graph':>13}{'ours graph':>12}{'launches':>11}"
    print(header)
    for count in tokens:
        torch.manual_seed(0)
        inputs = Inputs.make(count, device, dtype, args.kv)
        for name, (stock, ours) in OPS.items():
            row = f"{name:<20}{count:>5}  {eager_us(stock, inputs, calls):>12.1f}"
            row += f"{eager_us(ours, inputs, calls):>12.1f}"
            if device.type == "cuda":
                row += (
                    f"{graph_us(stock, inputs, calls):>13.1f}{graph_us(ours, inputs, calls):>12.1f}"
                )
            else:
                row += f"{'-':>13}{'-':>12}"
            row += f"{launches(stock, inputs):>6} → {launches(ours, inputs)}"
            print(row, flush=True)


if __name__ == "__main__":
    main()
