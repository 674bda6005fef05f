"""The CUDA backend's Triton layer kernels against the torch ops they replace. Without a GPU they
run in Triton's interpreter on CPU tensors (fp32 and fp16: the interpreter cannot hold bf16
tensors, so the bf16 cases skip "needs a CUDA GPU"); on a GPU the same tests run for real.

Exact where Triton can be exact: pool writes, the 8-bit pool's quantization (`quantize_rows`
bit for bit), the residual add. Within a stated tolerance where the math may differ in the last
bit: RMSNorm (the sum's order, rsqrt), rope (a fused multiply-add), SiLU and tanh-GELU (exp):
one step of a 16-bit output, 1e-5 relative in fp32 (`_assert_matches`); GELU also absolute.
"""

from __future__ import annotations

import importlib.util
import inspect
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")

from semantic.backends.torch.cuda.layers import TritonLayers
from semantic.backends.torch.int8 import quantize_rows
from semantic.backends.torch.kernels import CpuKernels
from semantic.backends.torch.models.layers import QKNorms, RMSNorm, gelu_tanh
from semantic.backends.torch.models.rope import Rope, apply_rope

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
DTYPES = [
    torch.float32,
    torch.float16,
    pytest.param(torch.bfloat16, marks=needs_gpu),
]
LAYERS = TritonLayers()
HEADS, KV_HEADS, DIM = 6, 2, 32  # SmolLM2's 3:1 grouping, small for the interpreter
POSITIONS = [0, 3, 17, 100, 2000]
SLOTS = [5, 0, -1, 9, 15]  # -1: a CUDA graph's padding row, never written


def _steps(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """The largest difference in units of the expected value's last place (in its dtype)."""
    gap = torch.nextafter(expected, torch.full_like(expected, float("inf"))) - expected
    return ((actual.float() - expected.float()).abs() / gap.float()).max().item()


def _assert_matches(actual: torch.Tensor, expected: torch.Tensor) -> None:
    """Rounded to 16 bits: at most one step of the dtype apart, and that in at most 2% of the
    values (a last fp32 bit flips a 16-bit rounding rarely; a missing intermediate rounding
    changes a quarter of them). In fp32 (where a fused multiply-add, the sum's order or another
    exp shows in the last bits, and a rope's sum of two products can cancel): within 1e-5
    relative, 1e-6 absolute."""
    if expected.dtype == torch.float32:
        torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-6)
    else:
        assert _steps(actual, expected) <= 1
        assert (actual != expected).float().mean().item() <= 0.02


def _rope_tables(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    rope = Rope(DIM, 10000.0, None, DEVICE)
    return rope.tables(torch.tensor(POSITIONS, device=DEVICE), dtype)


def _pool(dtype: torch.dtype, quantized: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A pool of 4 pages of 4 tokens full of a sentinel, so untouched rows show."""
    cache_dtype = torch.int8 if quantized else dtype
    cache = torch.full((4, 4, KV_HEADS, DIM), 7, dtype=cache_dtype, device=DEVICE)
    scales = torch.full((4, 4, KV_HEADS), 3.0, dtype=torch.bfloat16, device=DEVICE)
    return cache, scales if quantized else None


def _torch_write_kv(
    x: torch.Tensor, slots: torch.Tensor, cache: torch.Tensor, scales: torch.Tensor | None
) -> None:
    """The stock write (attention.write_kv's torch path) of the rows whose slot is >= 0."""
    keep = slots >= 0
    x, slots = x[keep], slots[keep]
    if scales is not None:
        x, x_scales = quantize_rows(x)
        scales.view(-1, scales.shape[2]).index_copy_(0, slots, x_scales)
    cache.view(-1, *cache.shape[2:]).index_copy_(0, slots, x)


def _rows_with_ties(dtype: torch.dtype) -> torch.Tensor:
    """[5, KVH, D]: random rows of several magnitudes, an all-zero row, and a row whose scale
    is exactly 1 with values halfway between steps (round half to even: 2.5 → 2, -3.5 → -4)."""
    torch.manual_seed(0)
    x = torch.randn(5, KV_HEADS, DIM) * torch.tensor([0.01, 1.0, 3.0, 50.0, 1.0])[:, None, None]
    x[3, 1] = 0.0
    x[4, 0] = 0.0
    x[4, 0, :5] = torch.tensor([127.0, 2.5, -3.5, 0.5, -0.5])
    return x.to(dtype=dtype, device=DEVICE)


def test_same_signatures_as_the_cpu_kernels() -> None:
    # the model's layers call either class through the same methods
    for name in ("rms_norm", "rope", "swiglu", "write_kv_int8"):
        ours = inspect.signature(getattr(TritonLayers, name))
        assert ours == inspect.signature(getattr(CpuKernels, name)), name


@pytest.mark.parametrize("dtype", DTYPES)
def test_write_kv_copies_rows_and_skips_negative_slots(dtype: torch.dtype) -> None:
    x = _rows_with_ties(dtype)
    slots = torch.tensor(SLOTS, device=DEVICE)
    cache, _ = _pool(dtype, quantized=False)
    expected = cache.clone()
    LAYERS.write_kv(x, slots, cache)
    _torch_write_kv(x, slots, expected, None)
    assert torch.equal(cache, expected)
    assert (cache.view(-1, KV_HEADS, DIM)[1:5] == 7).all()  # untouched, the -1 row among them


@pytest.mark.parametrize("dtype", DTYPES)
def test_write_kv_int8_matches_quantize_rows_bit_for_bit(dtype: torch.dtype) -> None:
    x = _rows_with_ties(dtype)
    slots = torch.tensor(SLOTS, device=DEVICE)
    cache, scales = _pool(dtype, quantized=True)
    assert scales is not None
    expected, expected_scales = cache.clone(), scales.clone()
    LAYERS.write_kv_int8(x, slots, cache, scales)
    _torch_write_kv(x, slots, expected, expected_scales)
    assert torch.equal(cache, expected)
    assert torch.equal(scales.view(torch.int16), expected_scales.view(torch.int16))
    # the tie row: scale 1, values rounded half to even; the zero row: scale 0, values 0
    tie_row = cache.view(-1, KV_HEADS, DIM)[15, 0, :5]
    assert tie_row.tolist() == [127, 2, -4, 0, 0]
    assert scales.view(-1, KV_HEADS)[9, 1].item() == 0.0
    assert (cache.view(-1, KV_HEADS, DIM)[9, 1] == 0).all()
    untouched = torch.ones(16, dtype=torch.bool, device=DEVICE)
    untouched[[5, 0, 9, 15]] = False
    assert (cache.view(-1, KV_HEADS, DIM)[untouched] == 7).all()
    assert (scales.view(-1, KV_HEADS)[untouched] == 3.0).all()


def test_write_kv_int8_scales_round_to_nearest_even_like_torch() -> None:
    # many magnitudes: the bf16 scale built from fp32 bits in the kernel equals torch's .to()
    torch.manual_seed(1)
    x = (
        torch.randn(64, KV_HEADS, DIM, device=DEVICE)
        * torch.logspace(-6, 6, 64, device=DEVICE)[:, None, None]
    )
    slots = torch.arange(64, device=DEVICE)
    cache = torch.zeros(16, 4, KV_HEADS, DIM, dtype=torch.int8, device=DEVICE)
    scales = torch.zeros(16, 4, KV_HEADS, dtype=torch.bfloat16, device=DEVICE)
    LAYERS.write_kv(x, slots, cache, scales)
    values, expected_scales = quantize_rows(x)
    assert torch.equal(cache.view(64, KV_HEADS, DIM), values)
    assert torch.equal(
        scales.view(64, KV_HEADS).view(torch.int16), expected_scales.view(torch.int16)
    )


@pytest.mark.parametrize("quantized", [False, True], ids=["plain", "int8"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_rope_write_kv_equals_rope_then_write(dtype: torch.dtype, quantized: bool) -> None:
    torch.manual_seed(0)
    qkv = (torch.randn(len(POSITIONS), HEADS + 2 * KV_HEADS, DIM) * 2).to(dtype).to(DEVICE)
    qkv[1, HEADS : HEADS + KV_HEADS] = 0.0  # a zero k row: scale 0 in an 8-bit pool
    cos, sin_signed = _rope_tables(dtype)
    slots = torch.tensor(SLOTS, device=DEVICE)
    (k_cache, k_scales), (v_cache, v_scales) = _pool(dtype, quantized), _pool(dtype, quantized)
    fused = qkv.clone()
    LAYERS.rope_write_kv(
        fused, HEADS, KV_HEADS, cos, sin_signed, slots, k_cache, v_cache, k_scales, v_scales
    )
    # rope apart: q and k roped in place as apply_rope ropes them, v untouched
    roped = apply_rope(qkv[:, : HEADS + KV_HEADS], cos, sin_signed)
    _assert_matches(fused[:, : HEADS + KV_HEADS], roped)
    assert torch.equal(fused[:, HEADS + KV_HEADS :], qkv[:, HEADS + KV_HEADS :])
    # the write apart, of the k the kernel roped: the pools hold exactly those rows
    (k_expected, k_exp_scales), (v_expected, v_exp_scales) = (
        _pool(dtype, quantized),
        _pool(dtype, quantized),
    )
    _torch_write_kv(fused[:, HEADS : HEADS + KV_HEADS], slots, k_expected, k_exp_scales)
    _torch_write_kv(qkv[:, HEADS + KV_HEADS :], slots, v_expected, v_exp_scales)
    assert torch.equal(k_cache, k_expected)
    assert torch.equal(v_cache, v_expected)
    if quantized:
        assert k_scales is not None and v_scales is not None
        assert k_exp_scales is not None and v_exp_scales is not None
        assert torch.equal(k_scales.view(torch.int16), k_exp_scales.view(torch.int16))
        assert torch.equal(v_scales.view(torch.int16), v_exp_scales.view(torch.int16))


@pytest.mark.parametrize("scale_in_fp32", [False, True], ids=["qwen3", "gemma3"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_rope_write_kv_with_qk_norms_equals_the_norms_then_rope_then_write(
    dtype: torch.dtype, scale_in_fp32: bool
) -> None:
    torch.manual_seed(0)
    qkv = (torch.randn(len(POSITIONS), HEADS + 2 * KV_HEADS, DIM) * 3).to(dtype).to(DEVICE)
    q_weight, k_weight = ((torch.rand(DIM) * 2 + 0.25).to(dtype).to(DEVICE) for _ in range(2))
    cos, sin_signed = _rope_tables(dtype)
    slots = torch.tensor(SLOTS, device=DEVICE)
    (k_cache, _), (v_cache, _) = _pool(dtype, False), _pool(dtype, False)
    fused = qkv.clone()
    norms = QKNorms(q_weight, k_weight, 1e-6, not scale_in_fp32)
    LAYERS.rope_write_kv(
        fused, HEADS, KV_HEADS, cos, sin_signed, slots, k_cache, v_cache, qk_norms=norms
    )
    # apart: each head's RMSNorm (the stock ops), then apply_rope
    q_norm, k_norm = (
        RMSNorm(weight, 1e-6, None, scale_in_fp32=scale_in_fp32) for weight in (q_weight, k_weight)
    )
    normed = torch.cat([q_norm(qkv[:, :HEADS]), k_norm(qkv[:, HEADS : HEADS + KV_HEADS])], 1)
    _assert_matches(fused[:, : HEADS + KV_HEADS], apply_rope(normed, cos, sin_signed))
    assert torch.equal(fused[:, HEADS + KV_HEADS :], qkv[:, HEADS + KV_HEADS :])
    k_expected, _ = _pool(dtype, False)
    _torch_write_kv(fused[:, HEADS : HEADS + KV_HEADS], slots, k_expected, None)
    assert torch.equal(k_cache, k_expected)


def test_a_qk_norm_weight_of_another_width_is_refused() -> None:
    qkv = torch.zeros(1, HEADS + 2 * KV_HEADS, DIM, device=DEVICE)
    cos, sin_signed = _rope_tables(torch.float32)
    (cache, _) = _pool(torch.float32, False)
    wrong = QKNorms(torch.ones(DIM, device=DEVICE), torch.ones(DIM // 2, device=DEVICE), 1e-6, True)
    with pytest.raises(ValueError, match="q/k norm's weight"):
        LAYERS.rope_write_kv(
            qkv,
            HEADS,
            KV_HEADS,
            cos[:1],
            sin_signed[:1],
            torch.zeros(1, dtype=torch.int64, device=DEVICE),
            cache,
            cache,
            qk_norms=wrong,
        )


@pytest.mark.parametrize("dtype", DTYPES)
def test_rope_equals_apply_rope_on_a_strided_view(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    qkv = torch.randn(len(POSITIONS), HEADS + 2 * KV_HEADS, DIM).to(dtype).to(DEVICE)
    qk = qkv[:, : HEADS + KV_HEADS]  # the layer's q and k heads: token stride ≠ heads · D
    cos, sin_signed = _rope_tables(dtype)
    out = LAYERS.rope(qk, cos, sin_signed)
    assert out.shape == qk.shape and out.is_contiguous()
    _assert_matches(out, apply_rope(qk, cos, sin_signed))


@pytest.mark.parametrize("scale_in_fp32", [False, True], ids=["llama", "gemma"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_matches_both_rounding_modes(dtype: torch.dtype, scale_in_fp32: bool) -> None:
    torch.manual_seed(0)
    x = (torch.randn(8, 576) * 3).to(dtype).to(DEVICE)
    weight = (torch.rand(576) + 0.5).to(dtype).to(DEVICE)
    stock = RMSNorm(weight, 1e-6, None, scale_in_fp32=scale_in_fp32)
    out = LAYERS.rms_norm(x, weight, 1e-6, not scale_in_fp32)
    _assert_matches(out, stock(x))


def test_rms_norm_modes_differ() -> None:
    # the two modes are told apart: fp16 rounds the normalised row first in one of them only
    torch.manual_seed(0)
    x = torch.randn(8, 48, dtype=torch.float16, device=DEVICE) * 3
    weight = (torch.rand(48, device=DEVICE) * 3 + 0.5).half()
    llama = LAYERS.rms_norm(x, weight, 1e-6, True)
    gemma = LAYERS.rms_norm(x, weight, 1e-6, False)
    assert not torch.equal(llama, gemma)


@pytest.mark.parametrize("scale_in_fp32", [False, True], ids=["llama", "gemma"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_add_rms_norm_adds_in_place_and_normalises(dtype: torch.dtype, scale_in_fp32: bool) -> None:
    torch.manual_seed(0)
    x = (torch.randn(8, 576) * 3).to(dtype).to(DEVICE)
    delta = torch.randn(8, 576).to(dtype).to(DEVICE)
    weight = (torch.rand(576) + 0.5).to(dtype).to(DEVICE)
    expected_x = x.clone()
    expected_x += delta  # the residual add as Block does it
    normed = LAYERS.add_rms_norm(x, delta, weight, 1e-6, not scale_in_fp32)
    assert torch.equal(x, expected_x)
    stock = RMSNorm(weight, 1e-6, None, scale_in_fp32=scale_in_fp32)
    _assert_matches(normed, stock(expected_x))


@pytest.mark.parametrize("dtype", DTYPES)
def test_swiglu_and_geglu_match_torch(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    gate_up = (torch.randn(8, 1024) * 3).to(dtype).to(DEVICE)
    gate, up = gate_up.chunk(2, dim=-1)
    _assert_matches(LAYERS.swiglu(gate_up), F.silu(gate) * up)
    # Torch's tanh-GELU, 0.5·x·(1 + tanh(y)), cancels for a strongly negative gate, where a
    # step of fp32 near 1 is a large part of the result; ours is x·sigmoid(2y). So the
    # tolerance is a step of the dtype, and also a few fp32 steps of 1 times |gate · up|.
    cancelled = 4 * torch.finfo(torch.float32).eps * (gate.float() * up.float()).abs().max()
    torch.testing.assert_close(
        LAYERS.geglu(gate_up).float(),
        (gelu_tanh(gate) * up).float(),
        rtol=max(torch.finfo(dtype).eps, 1e-5),
        atol=cancelled.item(),
    )


def test_bad_shapes_are_refused() -> None:
    qkv = torch.zeros(2, HEADS + 2 * KV_HEADS, DIM, device=DEVICE)
    cos, sin_signed = _rope_tables(torch.float32)
    slots = torch.zeros(2, dtype=torch.int64, device=DEVICE)
    cache, _ = _pool(torch.float32, quantized=False)
    with pytest.raises(ValueError, match="heads"):
        LAYERS.rope_write_kv(qkv, HEADS, KV_HEADS + 1, cos, sin_signed, slots, cache, cache)
    _, scales = _pool(torch.float32, quantized=True)
    with pytest.raises(ValueError, match="8-bit"):
        LAYERS.write_kv(qkv[:, :KV_HEADS], slots, cache, scales)
    with pytest.raises(ValueError, match="contiguous rows"):
        LAYERS.rms_norm(qkv[:, 0, ::2], torch.ones(DIM // 2, device=DEVICE), 1e-6)


_TRITON_TYPES = {
    torch.bfloat16: "bf16",
    torch.float16: "fp16",
    torch.float32: "fp32",
    torch.int8: "i8",
    torch.int16: "i16",
    torch.int64: "i64",
}


class _Recorder:
    """Stands in for a Triton kernel: keeps each launch's arguments instead of running it."""

    def __init__(self, kernel: Any) -> None:
        self.kernel = kernel
        self.launches: list[tuple[tuple[Any, ...], dict[str, Any]]] = []

    def __getitem__(self, grid: tuple[int, ...]) -> Any:
        return lambda *args, **kwargs: self.launches.append((args, kwargs))


def _every_op(layers: TritonLayers, device: str) -> None:
    """Each method of `layers` in each of its modes, on bf16 tensors of SmolLM2's shape."""

    def bf16(*shape: int) -> torch.Tensor:
        return torch.empty(shape, dtype=torch.bfloat16, device=device)

    x = bf16(4, 576)
    weight = bf16(576)
    for round_normed in (True, False):
        layers.rms_norm(x, weight, 1e-5, round_normed)
        layers.add_rms_norm(x, x, weight, 1e-5, round_normed)
    qkv = bf16(4, 15, 64)
    cos = bf16(4, 1, 64)
    slots = torch.empty(4, dtype=torch.int64, device=device)
    layers.rope(qkv[:, :12], cos, cos)
    pool = bf16(8, 16, 3, 64)
    int8_pool = torch.empty(8, 16, 3, 64, dtype=torch.int8, device=device)
    scales = bf16(8, 16, 3)
    layers.write_kv(qkv[:, 9:12], slots, pool)
    layers.write_kv_int8(qkv[:, 9:12], slots, int8_pool, scales)
    layers.rope_write_kv(qkv, 9, 3, cos, cos, slots, pool, pool)
    layers.rope_write_kv(qkv, 9, 3, cos, cos, slots, int8_pool, int8_pool, scales, scales)
    for round_normed in (True, False):  # Qwen3's q/k norms, Gemma 3's
        norms = QKNorms(weight[:64], weight[:64], 1e-6, round_normed)
        layers.rope_write_kv(qkv, 9, 3, cos, cos, slots, pool, pool, qk_norms=norms)
    gate_up = bf16(4, 2 * 1536)
    layers.swiglu(gate_up)
    layers.geglu(gate_up)


def _compile_for_hopper() -> None:
    """Run in a process without the interpreter: every launch `_every_op` makes, compiled by
    Triton for an H100 (sm_90) as a GPU would compile it, on no GPU at all."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from semantic.backends.torch.cuda import layers as module

    recorders = {}
    for name in dir(module):
        if name.endswith("_kernel"):
            recorders[name] = _Recorder(getattr(module, name))
            setattr(module, name, recorders[name])
    _every_op(module.TritonLayers(), "meta")
    for name, recorder in recorders.items():
        assert recorder.launches, f"{name} is never launched"
        for args, kwargs in recorder.launches:
            kernel = recorder.kernel
            signature = dict(zip(kernel.arg_names, map(_triton_type, args), strict=False))
            constexprs = {k: v for k, v in kwargs.items() if k in kernel.arg_names}
            signature.update(dict.fromkeys(constexprs, "constexpr"))
            options = {k: v for k, v in kwargs.items() if k not in kernel.arg_names}
            source = ASTSource(kernel, signature, constexprs)
            triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)


def _triton_type(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return "*" + _TRITON_TYPES[value.dtype]
    return "fp32" if isinstance(value, float) else "i32"


@pytest.mark.skipif(
    importlib.util.find_spec("triton.backends.nvidia") is None, reason="no Triton CUDA backend"
)
def test_kernels_compile_for_a_gpu_in_bf16() -> None:
    # The interpreter runs kernels as Python; a kernel it runs may still not compile (types,
    # shapes, bf16), so compile each as launched for bf16, down to the GPU's machine code.
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    code = "from tests.unit.test_cuda_layers import _compile_for_hopper; _compile_for_hopper()"
    root = Path(__file__).parents[2]
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-4000:]


@needs_gpu
def test_kernels_replay_in_a_cuda_graph() -> None:
    torch.manual_seed(0)
    dtype = torch.bfloat16
    qkv = torch.randn(4, HEADS + 2 * KV_HEADS, DIM, device=DEVICE, dtype=dtype)
    x = torch.randn(4, 48, device=DEVICE, dtype=dtype)
    delta = torch.randn(4, 48, device=DEVICE, dtype=dtype)
    weight = torch.ones(48, device=DEVICE, dtype=dtype)
    cos, sin_signed = _rope_tables(dtype)
    cos, sin_signed = cos[:4].clone(), sin_signed[:4].clone()
    slots = torch.tensor([3, 1, -1, 8], device=DEVICE)
    k_cache, k_scales = _pool(dtype, quantized=True)
    v_cache, v_scales = _pool(dtype, quantized=True)
    static = qkv.clone(), x.clone()

    def step() -> torch.Tensor:
        LAYERS.rope_write_kv(
            static[0], HEADS, KV_HEADS, cos, sin_signed, slots, k_cache, v_cache, k_scales, v_scales
        )
        return LAYERS.swiglu(LAYERS.add_rms_norm(static[1], delta, weight, 1e-6))

    step()  # compiles the kernels outside the capture
    static[0].copy_(qkv)
    static[1].copy_(x)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    static[0].copy_(qkv)
    static[1].copy_(x)
    graph.replay()
    torch.cuda.synchronize()
    eager_qkv, eager_x = qkv.clone(), x.clone()
    eager_k, eager_ks = _pool(dtype, quantized=True)
    eager_v, eager_vs = _pool(dtype, quantized=True)
    LAYERS.rope_write_kv(
        eager_qkv, HEADS, KV_HEADS, cos, sin_signed, slots, eager_k, eager_v, eager_ks, eager_vs
    )
    eager_out = LAYERS.swiglu(LAYERS.add_rms_norm(eager_x, delta, weight, 1e-6))
    assert torch.equal(static[0], eager_qkv) and torch.equal(static[1], eager_x)
    assert torch.equal(out, eager_out)
    assert torch.equal(k_cache, eager_k) and torch.equal(v_cache, eager_v)
