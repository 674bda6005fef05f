"""Our group kernel over a GGUF's per-32 blocks (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0: `FlatWeight`):
the packed weight holds the file's values bit for bit (the `gguf` package's dequantizer) at the
file's own size; the kernel computes x·Wᵀ over them with x quantized to int8 per group of 32, as
an fp64 reference that quantizes x the same way does; a row gives the same bits alone and
batched (rows 1..33); partial panels, a bias and any K in whole groups of 32 work, other K is
refused. A float weight whose K is no multiple of 256 takes Q8_0's form, within half its
group's step. Needs our kernels (AVX-512 BF16 and VNNI); skips, saying which is missing,
without them."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, quants

from semantic.backends.torch.blocks import FlatWeight, GroupLinear, grouped
from semantic.backends.torch.kernels import CpuKernels, cpu_kernels, unavailable_reason
from semantic.backends.torch.models.weights import Weights
from semantic.models.q32 import READERS, Q32Blocks
from tests.unit.test_int8_weights import quantized_x
from tests.unit.test_q4k_kernel import assert_rows_alone_as_batched, gguf_build, kernel_bound
from tests.unit.test_q32 import KINDS, random_q32

KERNELS = cpu_kernels()
pytestmark = pytest.mark.skipif(
    KERNELS is None, reason=f"needs our AVX-512 BF16/VNNI kernels: {unavailable_reason()}"
)
SHAPES = [(1, 32), (40, 96), (16, 576), (257, 896)]  # N: one row, partial panels, whole
BITS = {"Q4_0": 4.5, "Q4_1": 5.0, "Q5_0": 5.5, "Q5_1": 6.0, "Q8_0": 8.5}  # the file's own


def ours() -> CpuKernels:
    assert KERNELS is not None
    return KERNELS


def file_blocks(kind: str, n: int, k: int, seed: int = 0) -> tuple[Q32Blocks, np.ndarray]:
    """The blocks as read, and the `gguf` package's floats of the same bytes."""
    data = random_q32(kind, n, k, seed)
    expected = quants.dequantize(data, GGMLQuantizationType[kind]).reshape(n, k)
    return READERS[kind](data, n, k), expected


@pytest.mark.parametrize(("n", "k"), SHAPES)
@pytest.mark.parametrize("kind", KINDS)
def test_a_files_blocks_are_held_bit_for_bit_at_its_size(n, k, kind):
    blocks, expected = file_blocks(kind, n, k, seed=n)
    weight = FlatWeight.from_blocks(blocks)
    assert weight.planes == {4: 4, 5: 5, 8: 8}[blocks.bits]
    back = weight.rows(torch.arange(n)).numpy()
    np.testing.assert_array_equal(back.view(np.uint32), expected.view(np.uint32))
    assert weight.nbytes == -(-n // 16) * 16 * k * BITS[kind] / 8


@pytest.mark.parametrize(("n", "k"), SHAPES)
@pytest.mark.parametrize("rows", [1, 3, 8, 9, 33])
@pytest.mark.parametrize("kind", KINDS)
def test_the_kernel_is_the_product_with_x_quantized_per_group(n, k, rows, kind):
    torch.manual_seed(rows + n)
    blocks, expected = file_blocks(kind, n, k, seed=n + k)
    w = torch.from_numpy(expected)
    x = torch.randn(rows, k).bfloat16()
    y = GroupLinear(FlatWeight.from_blocks(blocks), None, ours())(x)
    assert y.dtype == torch.bfloat16 and y.shape == (rows, n)
    xq = quantized_x(x)
    assert torch.all((y.double() - xq @ w.double().T).abs() <= kernel_bound(w, xq))


@pytest.mark.parametrize("kind", [*KINDS, "quantized"])
def test_a_row_gets_the_same_bits_alone_and_batched(kind):
    n, k = 40, 96
    if kind == "quantized":
        weight = FlatWeight.quantize(torch.randn(n, k))
    else:
        weight = FlatWeight.from_blocks(file_blocks(kind, n, k, seed=5)[0])
    assert_rows_alone_as_batched(GroupLinear(weight, torch.randn(n).bfloat16(), ours()), k)


@pytest.mark.parametrize("kind", ["Q4_1", "Q5_0"])
def test_the_bias_is_added_once(kind):
    weight = FlatWeight.from_blocks(file_blocks(kind, 24, 64, seed=6)[0])
    bias = torch.randn(24).bfloat16()
    x = torch.randn(4, 64).bfloat16()
    with_bias = GroupLinear(weight, bias, ours())(x).float()
    without = GroupLinear(weight, None, ours())(x).float()
    assert torch.allclose(with_bias, without + bias.float(), atol=0.1, rtol=2**-7)


@pytest.mark.parametrize(("n", "k"), [(40, 96), (257, 896)])
def test_a_float_weight_in_q8_0s_form_is_within_half_its_groups_step(n, k):
    torch.manual_seed(n)
    w = torch.randn(n, k) * torch.logspace(-3, 1, k)  # groups of very different sizes
    w[:, 32:64] = 0.0  # an all-zero group: d 0
    weight = grouped(w)
    assert isinstance(weight, FlatWeight) and weight.planes == 8
    d = (w.view(n, -1, 32).abs().amax(-1, keepdim=True) / 127).half().float()
    step = d.expand(-1, -1, 32).reshape(n, k)
    back = weight.rows(torch.arange(n))
    # d is rounded to fp16: a value at the group's largest may round a hair past 127 steps
    assert torch.all((back - w).abs() <= step * (0.5 + 2**-10))
    assert torch.equal(back[:, 32:64], torch.zeros(n, 32))
    x = torch.randn(5, k).bfloat16()
    y = GroupLinear(weight, None, ours())(x)
    xq = quantized_x(x)
    assert torch.all((y.double() - xq @ back.double().T).abs() <= kernel_bound(back, xq))


def test_k_not_in_whole_groups_is_refused():
    weight = FlatWeight.from_blocks(file_blocks("Q8_0", 16, 64)[0])
    x = torch.randn(1, 72).bfloat16()
    with pytest.raises(RuntimeError, match="multiple of 32"):
        ours().flat_linear(x, weight.values, weight.factors, 128, 16, None)


def test_a_gguf_build_computes_per_32_blocks_on_their_own_and_fuses_them_exactly():
    arrays = [
        ("q", file_blocks("Q5_0", 32, 64, seed=1)[0]),
        ("k", file_blocks("Q5_0", 16, 64, seed=2)[0]),
        ("v", file_blocks("Q8_0", 16, 64, seed=3)[0]),
        ("up", file_blocks("Q4_1", 48, 64, seed=4)[0]),
    ]
    expected = {name: blocks.dequantize() for name, blocks in arrays}
    weights = Weights.load(arrays, gguf_build(ours()))
    qkv = weights.linear(weights.fused(["q", "k", "v"]), None)
    assert isinstance(qkv, GroupLinear) and qkv.weight.planes == 8  # widened, exactly
    fused = np.concatenate([expected[name] for name in "qkv"])
    np.testing.assert_array_equal(qkv.weight.rows(torch.arange(64)).numpy(), fused)
    up = weights.linear(weights.take_matrix("up"), None)
    assert isinstance(up, GroupLinear) and up.weight.planes == 4
    ids = torch.tensor([0, 47, 5])
    assert torch.equal(up.rows(ids), torch.from_numpy(expected["up"][ids.numpy()]).bfloat16())
