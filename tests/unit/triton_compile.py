"""Compile the CUDA attention kernels' launches for an H100 (sm_90) with no GPU at hand, the
way Triton would at their first launch there: what the interpreter never checks (types that
must agree across branches, tl.dot's shapes, registers) fails here. Prints each launch's
registers and stack bytes (spills) from the cubin; exits 1 if a launch fails to compile or a
16-bit one spills.

    TRITON_INTERPRET=0 python -m tests.unit.triton_compile

Run in a process of its own: Triton picks the interpreter or the compiler when kernels are
defined, and the tests define them for the interpreter.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from semantic.backends.torch.cuda.attention import Launch, TritonAttention
from semantic.backends.torch.int8 import quantize_rows

TARGET = GPUTarget("cuda", 90, 32)
CUOBJDUMP = Path(triton.__file__).parent / "backends/nvidia/bin/cuobjdump"
_TYPES = {
    torch.bfloat16: "bf16",
    torch.float16: "fp16",
    torch.float32: "fp32",
    torch.int8: "i8",
    torch.int16: "i16",
    torch.int32: "i32",
    torch.int64: "i64",
}


def compile_launch(launch: Launch) -> triton.compiler.CompiledKernel:
    """The launch compiled for TARGET, its arguments typed and specialized (pointers and ints
    divisible by 16 marked so) as a JIT launch would have them."""
    kernel = launch.kernel
    runtime = [name for name in kernel.arg_names if name not in launch.constants]
    signature: dict[str, str] = {name: "constexpr" for name in launch.constants}
    attrs = {}
    fixed = set(kernel.do_not_specialize)
    for name, value in zip(runtime, launch.args, strict=True):
        if isinstance(value, torch.Tensor):
            signature[name] = "*" + _TYPES[value.dtype]
            aligned = value.data_ptr() % 16 == 0
        elif isinstance(value, bool):
            signature[name], aligned = "i1", False
        elif isinstance(value, int):
            signature[name], aligned = "i32", value % 16 == 0
        else:
            signature[name], aligned = "fp32", False
        if aligned and name not in fixed:
            attrs[(kernel.arg_names.index(name),)] = [["tt.divisibility", 16]]
    signature = {name: signature[name] for name in kernel.arg_names}
    source = ASTSource(kernel, signature, dict(launch.constants), attrs)
    return triton.compile(source, target=TARGET, options={"num_warps": launch.num_warps})


def registers(compiled: triton.compiler.CompiledKernel) -> tuple[int, int]:
    """(registers per thread, stack bytes per thread) as ptxas allotted them."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
        cubin.write(compiled.asm["cubin"])
        cubin.flush()
        usage = subprocess.run(
            [str(CUOBJDUMP), "--dump-resource-usage", cubin.name],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    found = re.search(r"REG:(\d+) STACK:(\d+)", usage)
    assert found, usage
    return int(found[1]), int(found[2])


def pool(
    kv_heads: int, dim: int, block_tokens: int, dtype: torch.dtype, int8: bool = False
) -> tuple[torch.Tensor, ...]:
    shape = (8, block_tokens, kv_heads, dim)
    if int8:
        (k, ks), (v, vs) = quantize_rows(torch.randn(shape)), quantize_rows(torch.randn(shape))
        return k, v, ks, vs
    return torch.randn(shape).to(dtype), torch.randn(shape).to(dtype)


def decode(
    heads: int,
    kv_heads: int,
    dim: int,
    block_tokens: int,
    dtype: torch.dtype,
    window: int | None = None,
    sinks: bool = False,
    int8: bool = False,
) -> list[Launch]:
    k, v, *scales = pool(kv_heads, dim, block_tokens, dtype, int8)
    q = torch.randn(4, heads, dim).to(dtype)
    tables = torch.zeros(4, 8, dtype=torch.int64)
    lens = torch.full((4,), 8 * block_tokens, dtype=torch.int64)
    logits = torch.randn(heads) if sinks else None
    launches: list[Launch] = []
    TritonAttention(launch=launches.append).decode_attention(
        q, k, v, tables, lens, 0.125, window, logits, *scales
    )
    return launches


def prefill(
    heads: int,
    kv_heads: int,
    dim: int,
    block_tokens: int | None,
    dtype: torch.dtype,
    window: int | None = None,
    sinks: bool = False,
    int8: bool = False,
    sm_count: int | None = None,
) -> list[Launch]:
    """A paged chunk after context, or with `block_tokens` None a first chunk's own K/V."""
    q = torch.randn(100, heads, dim).to(dtype)
    logits = torch.randn(heads) if sinks else None
    launches: list[Launch] = []
    kernels = TritonAttention(sm_count, launch=launches.append)
    if block_tokens is None:
        own = torch.randn(100, 2 * kv_heads, dim).to(dtype)
        k, v = own[:, :kv_heads], own[:, kv_heads:]
        kernels.prefill_attention(q, k, v, None, 0, 0.125, window, logits)
    else:
        k, v, *scales = pool(kv_heads, dim, block_tokens, dtype, int8)
        table = torch.arange(8)
        kernels.prefill_attention(q, k, v, table, 200, 0.125, window, logits, *scales)
    assert len(launches) == 1
    return launches


BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32
CASES = {
    "decode SmolLM2, split": lambda: decode(9, 3, 64, 256, BF16),
    "decode 1B, window, sinks": lambda: decode(32, 8, 64, 256, BF16, 1000, True),
    "decode int8, blocks of 16": lambda: decode(8, 2, 128, 16, BF16, 40, True, True),
    "decode blocks of 24 (by token)": lambda: decode(9, 3, 64, 24, FP16),
    "decode head_dim 256": lambda: decode(4, 1, 256, 256, BF16, None, True),
    "decode head_dim 80": lambda: decode(8, 8, 80, 256, BF16),
    "decode fp32": lambda: decode(9, 3, 64, 256, FP32),
    "prefill own rows, window, sinks": lambda: prefill(9, 3, 64, None, BF16, 128, True),
    "prefill 1B, paged": lambda: prefill(32, 8, 64, 256, BF16),
    "prefill 1B, paged, 64-row tiles": lambda: prefill(32, 8, 64, 256, BF16, sm_count=1),
    "prefill head_dim 128, int8": lambda: prefill(8, 2, 128, 256, BF16, None, False, True),
    "prefill head_dim 256, sinks": lambda: prefill(4, 1, 256, 256, BF16, 512, True),
    "prefill head_dim 256, 64-row tiles": lambda: prefill(4, 1, 256, 256, BF16, sm_count=1),
    "prefill head_dim 128, 64-row tiles": lambda: prefill(8, 2, 128, 256, FP16, sm_count=1),
    "prefill blocks of 24 (by token)": lambda: prefill(9, 3, 64, 24, FP16),
    "prefill fp32": lambda: prefill(9, 3, 64, 256, FP32),
}


def main() -> int:
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        raise SystemExit("run with TRITON_INTERPRET=0: the interpreter compiles nothing")
    failed = False
    for name, make in CASES.items():
        for launch in make():
            kernel = launch.kernel.__name__
            try:
                regs, stack = registers(compile_launch(launch))
            except Exception as exc:  # report every case, then fail
                print(f"FAIL {name} {kernel}: {exc}")
                failed = True
                continue
            spills = stack > 0 and launch.args[0].dtype != FP32
            failed |= spills
            flag = "SPILLS" if spills else "ok"
            usage = f"{launch.num_warps} warps, {regs:3d} registers, stack {stack:4d} bytes"
            print(f"{flag:6} {name:34} {kernel:22} {usage}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
