"""Our kernel over weights in quantized groups (a GGUF's Q4_K, Q5_K and Q6_K blocks, and the byte
form): the packed weight holds the file's values bit for bit; the kernel computes x·Wᵀ over them
with x quantized to int8 a step per super-block of 256, halved for small groups, as an fp64
reference that quantizes x the same way does, and within that quantization's own error of the fp32
product; a row gives the same bits alone and batched (rows 1..33); partial panels (N not a multiple
of 16) and a bias work; K not in whole blocks of 256 is refused. A `weights = "gguf"` build puts a
file's blocks on it, and its other matrices in the byte form (Q8_0's where K is no multiple of 256,
int8 rows where not even of 32); without our kernels Q4_K stays on torch's int4 kernel (a Q5_K does
not)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from semantic.backends.torch.blocks import (
    FlatWeight,
    GroupLinear,
    GroupWeight,
    block_factory,
    takes,
)
from semantic.backends.torch.int4 import Int4Linear
from semantic.backends.torch.kernels import CpuKernels, cpu_kernels, unavailable_reason
from semantic.backends.torch.linear import Int8Linear, linear_factory
from semantic.backends.torch.models.layers import Build
from semantic.backends.torch.models.weights import Weights
from semantic.models.config import ModelConfig
from semantic.models.q4k import Q4KBlocks, read_q4k, read_q5k
from semantic.models.q6k import Blocks, Q6KBlocks, read_q6k
from tests.benchmark_script import load_benchmark
from tests.unit.test_q4k import random_q4k, random_q5k
from tests.unit.test_q6k import random_q6k

KERNELS = cpu_kernels()
needs_kernels = pytest.mark.skipif(KERNELS is None, reason=f"no kernels: {unavailable_reason()}")
SHAPES = [(1, 256), (40, 512), (16, 1536), (257, 768)]  # N: one row, partial panels, whole


def ours() -> CpuKernels:
    assert KERNELS is not None
    return KERNELS


def q4k(n: int, k: int, seed: int = 0) -> Q4KBlocks:
    return read_q4k(random_q4k(n, k, seed), n, k)


def file_blocks(kind: str, n: int, k: int, seed: int = 0) -> Blocks:
    if kind == "q4k":
        return q4k(n, k, seed)
    if kind == "q5k":
        return read_q5k(random_q5k(n, k, seed), n, k)
    return read_q6k(random_q6k(n, k, seed), n, k)


def packed(blocks: Blocks) -> GroupWeight:
    if isinstance(blocks, Q4KBlocks):
        return GroupWeight.from_q4k(blocks)
    assert isinstance(blocks, Q6KBlocks)
    return GroupWeight.from_q6k(blocks)


def x_steps(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K]'s quantization as the kernel does it, per value (fp32): its super-block's
    127 / largest |x|, and the times its group of 32's step halves from largest / 127: while the
    group's own largest still fits in ±127 of the halved step, 3 times at most."""
    m, k = x.shape
    groups = x.float().view(m, -1, 8, 32).abs().amax(-1, keepdim=True)
    largest = groups.amax(-2, keepdim=True)
    # a true division: `127.0 / tensor` is torch's reciprocal times 127, which rounds apart
    unit = torch.where(largest > 0, torch.full_like(largest, 127.0) / largest, 0.0)
    halved = sum((groups * 2.0**h <= largest).float() for h in (1, 2, 3))
    return (
        unit.expand(-1, -1, 8, 32).reshape(m, k),
        torch.as_tensor(halved).expand(-1, -1, -1, 32).reshape(m, k),
    )


def x_step(x: torch.Tensor) -> torch.Tensor:
    unit, halved = x_steps(x)
    return torch.where(unit > 0, 1 / unit.double(), 0.0) / 2.0**halved


def quantized_x(x: torch.Tensor) -> torch.Tensor:
    """x [M, K] as the kernel sees it, fp64: q = round(x / its step), times the step."""
    unit, halved = x_steps(x)
    q = (x.float() * (unit * 2.0**halved)).round()
    return q.double() * x_step(x)


def kernel_bound(w: torch.Tensor, xq: torch.Tensor) -> torch.Tensor:
    """What the kernel's fp32 sums and bf16 output may differ by from the fp64 reference over x
    as quantized, `xq`: a few fp32 roundings of every product's size, and half a bf16 step of
    the result."""
    size = xq.abs() @ w.double().abs().T
    return size * 1e-5 + (xq @ w.double().T).abs() * 2.0**-8


@needs_kernels
@pytest.mark.parametrize(("n", "k"), SHAPES)
@pytest.mark.parametrize(
    ("kind", "bits"), [("q4k", 4 + 16 / 32 + 64 / 256), ("q5k", 5.75), ("q6k", 6.75)]
)
def test_a_files_blocks_are_held_bit_for_bit(n, k, kind, bits):
    blocks = file_blocks(kind, n, k, seed=n)
    weight = packed(blocks)
    assert weight.planes == {"q4k": 4, "q5k": 5, "q6k": 6}[kind]
    assert torch.equal(weight.rows(torch.arange(n)), torch.from_numpy(blocks.dequantize()))
    # Q4_K: 4 bits a value, a byte of codes per group and 8 bytes of d, dmin per 256; Q5_K: a
    # bit more a value; Q6_K: 6 bits, a byte of sc per 16 and the same 8 bytes
    assert weight.nbytes == -(-n // 16) * 16 * k * bits / 8


@needs_kernels
@pytest.mark.parametrize(("n", "k"), SHAPES)
@pytest.mark.parametrize("rows", [1, 3, 8, 9, 33])
@pytest.mark.parametrize("kind", ["q4k", "q5k", "q6k"])
def test_the_kernel_is_the_product_with_x_quantized_per_group(n, k, rows, kind):
    torch.manual_seed(rows + n)
    blocks = file_blocks(kind, n, k, seed=n + k)
    w = torch.from_numpy(blocks.dequantize())
    x = torch.randn(rows, k).bfloat16()
    y = GroupLinear(packed(blocks), None, ours())(x)
    assert y.dtype == torch.bfloat16 and y.shape == (rows, n)
    xq = quantized_x(x)
    assert torch.all((y.double() - xq @ w.double().T).abs() <= kernel_bound(w, xq))
    # x's quantization moves each value by at most half its step: the product by at most Σ|w|
    # times that, which explains the whole distance to the fp32 product
    x_error = (x_step(x) / 2) @ w.double().abs().T
    exact = x.double() @ w.double().T
    assert torch.all((y.double() - exact).abs() <= x_error + kernel_bound(w, xq))


@needs_kernels
@pytest.mark.parametrize("kind", ["q4k", "q5k", "q6k"])
def test_a_group_of_small_values_keeps_a_finer_step(kind):
    n, k = 32, 512
    blocks = file_blocks(kind, n, k, seed=7)
    w = torch.from_numpy(blocks.dequantize())
    torch.manual_seed(7)
    # groups of under 1/2, 1/4, 1/8 and 1/100 of the super-block's largest: steps halved 1, 2,
    # 3 and 3 times
    sizes = torch.tensor([1.0, 0.45, 0.2, 0.1, 0.01, 1.0, 0.0, 0.3]).repeat(2)
    x = (torch.rand(4, k) * 2 - 1) * sizes.repeat_interleave(32)
    x[:, 0] = 1.0  # each super-block's largest
    x[:, 256] = -1.0
    x = x.bfloat16()
    _, halved = x_steps(x)
    assert set(halved[0, ::32].tolist()) == {0.0, 1.0, 2.0, 3.0}
    y = GroupLinear(packed(blocks), None, ours())(x)
    xq = quantized_x(x)
    assert torch.all((y.double() - xq @ w.double().T).abs() <= kernel_bound(w, xq))


@needs_kernels
@pytest.mark.parametrize("kind", ["q4k", "q5k", "q6k", "bytes"])
def test_a_row_gets_the_same_bits_alone_and_batched(kind):
    n, k = 40, 768
    if kind == "bytes":
        weight = GroupWeight.quantize(torch.randn(n, k))
    else:
        weight = packed(file_blocks(kind, n, k, seed=5))
    assert_rows_alone_as_batched(GroupLinear(weight, torch.randn(n).bfloat16(), ours()), k)


def assert_rows_alone_as_batched(linear: GroupLinear, k: int) -> None:
    """Each of 33 rows gets the same bits from `linear` alone and in every batch of 1-33."""
    x = torch.randn(33, k).bfloat16()
    alone = torch.cat([linear(x[i : i + 1]) for i in range(33)])
    for rows in range(1, 34):
        assert torch.equal(linear(x[:rows]), alone[:rows]), rows


@needs_kernels
def test_the_bias_is_added_once():
    n, k = 24, 256
    weight = GroupWeight.from_q4k(q4k(n, k, seed=6))
    bias = torch.randn(n).bfloat16()
    x = torch.randn(4, k).bfloat16()
    with_bias = GroupLinear(weight, bias, ours())(x).float()
    without = GroupLinear(weight, None, ours())(x).float()
    assert torch.allclose(with_bias, without + bias.float(), atol=0.1, rtol=2**-7)


@needs_kernels
@pytest.mark.parametrize(("n", "k"), SHAPES)
def test_any_weight_in_the_byte_form_is_within_half_its_groups_step(n, k):
    torch.manual_seed(n)
    w = torch.randn(n, k) * torch.logspace(-3, 1, k)  # groups of very different sizes
    w[:, 32:64] = 0.0  # an all-zero group: its code 0
    weight = GroupWeight.quantize(w)
    assert weight.planes == 8
    largest = w.view(n, -1, 32).abs().amax(-1, keepdim=True)
    step = (largest / 127).expand(-1, -1, 32).reshape(n, k)
    back = weight.rows(torch.arange(n))
    # a group's step is rounded up to a multiple of d, the block's largest step / 255
    d = largest.view(n, -1, 8).amax(-1, keepdim=True) / 127 / 255
    slack = d.expand(-1, -1, 256).reshape(n, k)
    assert torch.all((back - w).abs() <= (step + slack) / 2 * (1 + 1e-5))
    assert torch.equal(back[:, 32:64], torch.zeros(n, 32))
    x = torch.randn(5, k).bfloat16()
    y = GroupLinear(weight, None, ours())(x)
    xq = quantized_x(x)
    assert torch.all((y.double() - xq @ back.double().T).abs() <= kernel_bound(back, xq))


@needs_kernels
def test_k_not_in_whole_blocks_is_refused():
    # a float weight in groups of 32 goes to the byte form in 256s, else to Q8_0's (test_q32_kernel)
    assert takes((64, 512)) and takes((64, 544)) and not takes((64, 100)) and not takes((64, 0))
    weight = GroupWeight.quantize(torch.randn(16, 256))
    with pytest.raises(RuntimeError, match="multiple of 256"):
        ours().block_linear(
            torch.randn(1, 288).bfloat16(), weight.values, weight.codes, weight.supers, 16, None
        )


@needs_kernels
def test_a_group_of_planes_no_form_has_is_refused():
    weight = GroupWeight.quantize(torch.randn(16, 256))  # 8 planes of bytes
    x = torch.randn(1, 256).bfloat16()
    for planes in (3, 7):
        values = weight.values[:, :, :planes].contiguous()
        with pytest.raises(RuntimeError, match="4, 5, 6 or 8"):
            ours().block_linear(x, values, weight.codes, weight.supers, 16, None)


def gguf_build(kernels: CpuKernels | None) -> Build:
    """A bf16 build of `weights = "gguf"` as the runner makes it, with or without our kernels."""
    config = ModelConfig(
        model_type="qwen2",
        vocab_size=128,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=64,
    )
    cpu, bf16 = torch.device("cpu"), torch.bfloat16
    linear = linear_factory(cpu, bf16, kernels, "gguf")
    blocks = block_factory(cpu, bf16, kernels, "gguf")
    return Build(config, bf16, cpu, linear, kernels, "gguf", blocks)


@needs_kernels
def test_a_gguf_computes_its_blocks_on_the_kernel_and_the_rest_in_groups_or_rows():
    dense = np.random.default_rng(0).standard_normal((32, 256)).astype(np.float32)
    narrow = np.random.default_rng(1).standard_normal((32, 96)).astype(np.float32)
    odd = np.random.default_rng(1).standard_normal((32, 100)).astype(np.float32)
    arrays: list[tuple[str, np.ndarray | Blocks]] = [
        ("q4k", file_blocks("q4k", 40, 256)),
        ("q5k", file_blocks("q5k", 40, 256)),
        ("q6k", file_blocks("q6k", 40, 512)),
        ("dense", dense),
        ("narrow", narrow),
        ("odd", odd),
        ("mixed_a", file_blocks("q4k", 32, 256, seed=1)),
        ("mixed_b", file_blocks("q6k", 32, 256, seed=2)),
        ("mixed_c", file_blocks("q4k", 32, 256, seed=3)),
        ("mixed_d", file_blocks("q5k", 32, 256, seed=4)),
    ]
    weights = Weights.load(arrays, gguf_build(ours()))
    planes = {}
    for name in ("q4k", "q5k", "q6k", "dense"):
        linear = weights.linear(weights.take_matrix(name), None)
        assert isinstance(linear, GroupLinear)
        planes[name] = linear.weight.planes
    assert planes == {"q4k": 4, "q5k": 5, "q6k": 6, "dense": 8}
    # no multiple of 256 wide: Q8_0's form; not in groups of 32: int8 rows; parts of two
    # kinds: dequantized, then 8-bit groups
    narrow_linear = weights.linear(weights.take_matrix("narrow"), None)
    assert isinstance(narrow_linear, GroupLinear) and isinstance(narrow_linear.weight, FlatWeight)
    assert isinstance(weights.linear(weights.take_matrix("odd"), None), Int8Linear)
    mixed = weights.linear(weights.fused(["mixed_a", "mixed_b"]), None)
    assert isinstance(mixed, GroupLinear) and mixed.weight.planes == 8
    four_and_five = weights.linear(weights.fused(["mixed_c", "mixed_d"]), None)
    assert isinstance(four_and_five, GroupLinear) and four_and_five.weight.planes == 8


def test_without_our_kernels_a_gguf_keeps_q4k_on_torchs_int4_kernel():
    assert block_factory(torch.device("cpu"), torch.bfloat16, None, "gguf") is None
    arrays: list[tuple[str, np.ndarray | Blocks]] = [
        ("q4k", file_blocks("q4k", 32, 256)),
        ("q5k", file_blocks("q5k", 32, 256)),
        ("q6k", file_blocks("q6k", 32, 256)),
    ]
    weights = Weights.load(arrays, gguf_build(None))
    assert isinstance(weights.linear(weights.take_matrix("q4k"), None), Int4Linear)
    for name in ("q5k", "q6k"):  # dequantized, as loaded: torch's int4 takes 4 bits only
        linear = weights.linear(weights.take_matrix(name), None)
        assert not isinstance(linear, GroupLinear | Int4Linear), name


@needs_kernels
def test_the_benchmarks_formats_compute_the_same_matrix():
    bench = load_benchmark("group_kernel")
    x = torch.randn(3, 512).bfloat16()
    exact = x.float() @ bench.dense(48, 512, 7).T
    for name in ("bf16", "int8", "q4k"):  # q5k, q6k are other matrices: their own blocks
        y = bench.FORMATS[name](48, 512, 7, ours())(x).float()
        assert torch.allclose(y, exact, atol=0.05 * float(exact.abs().max())), name
    for name in ("q5k", "q6k"):
        assert bench.FORMATS[name](48, 512, 7, ours())(x).shape == (3, 48)


@needs_kernels
def test_the_benchmark_compares_builds_each_in_a_process_of_its_own():
    library = str(ours()._module.__file__)
    script = Path(__file__).parents[2] / "benchmarks" / "group_kernel.py"
    command = [sys.executable, str(script), "--library", library, "--library", library]
    command += ["--shape", "32x256", "--formats", "q4k", "--rows", "1,3", "--runs", "1"]
    out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    rows = [line for line in out.splitlines() if line.startswith("| q4k 32x256")]
    assert [row.split(" | ")[0] for row in rows] == ["| q4k 32x256, 1 rows", "| q4k 32x256, 3 rows"]
    assert all(float(cell) > 0 for row in rows for cell in row.strip(" |").split(" | ")[1:])
