"""8-bit weights: a weight quantized per output row comes back within half a step of each value;
the int8 linear equals `F.linear` over the dequantized weight with x quantized per block of 32
values (odd shapes, a bias, one row to a prefill chunk's), and gives a row the same bits alone
and batched; its rows are the dequantized weight rounded once to bf16; and a whole model with
`weights="int8"` computes with our kernels what the fallback that dequantizes at each call
(CUDA, or a CPU without them) does, within x's quantization."""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F

from semantic.backends.torch.int8 import quantize_rows
from semantic.backends.torch.kernels import Int8PanelWeight, cpu_kernels, unavailable_reason
from semantic.backends.torch.linear import DequantizingLinear, Int8Linear, linear_factory
from semantic.backends.torch.runner import TorchRunner
from semantic.errors import ModelLoadFailed
from tests.unit.test_cpu_kernels import step_logits
from tests.unit.tiny_llama import tiny_llama

KERNELS = cpu_kernels()
needs_kernels = pytest.mark.skipif(KERNELS is None, reason=f"no kernels: {unavailable_reason()}")
SHAPES = [(1, 1), (33, 71), (96, 576), (17, 2), (70, 201)]  # odd N and K, partial panels


def dequantized(w: torch.Tensor) -> torch.Tensor:
    q, scales = quantize_rows(w, torch.float32)
    return q.float() * scales[:, None]


def quantized_x(x: torch.Tensor) -> torch.Tensor:
    """x [M, K] as the int8 kernel sees it, fp64: per block of 32 values, q = round(x · 127 /
    the block's largest |x|) times that largest / 127."""
    m, k = x.shape
    blocks = F.pad(x.float(), (0, -k % 32)).view(m, -1, 32)
    largest = blocks.abs().amax(-1, keepdim=True)
    # a true division: `127.0 / tensor` is torch's reciprocal times 127, which rounds apart
    inverse = torch.where(largest > 0, torch.full_like(largest, 127.0) / largest, 0.0)
    q = (blocks * inverse).round()
    return (q.double() * (largest / 127.0).double()).view(m, -1)[:, :k]


@pytest.mark.parametrize(("n", "k"), SHAPES)
def test_quantized_rows_come_back_within_half_a_step(n, k):
    torch.manual_seed(n * k)
    w = torch.randn(n, k) * torch.logspace(-3, 1, n)[:, None]  # rows of very different sizes
    w[n // 2] = 0.0  # an all-zero row: all q 0
    q, scales = quantize_rows(w, torch.float32)
    assert q.dtype == torch.int8 and scales.shape == (n,)
    assert int(q.abs().max()) <= 127
    step = scales[:, None]
    assert torch.all((q.float() * step - w).abs() <= step / 2 * (1 + 1e-6))
    assert torch.equal(q[n // 2], torch.zeros(k, dtype=torch.int8))
    # each nonzero row uses the whole range: its largest value is ±127 steps
    nonzero = w.abs().amax(dim=1) > 0
    assert torch.all(q.abs().amax(dim=1)[nonzero] == 127)


def test_x_is_quantized_within_half_a_step_of_its_block():
    x = torch.randn(3, 70) * torch.logspace(-4, 2, 70)  # blocks of very different sizes
    x[1, 32:64] = 0.0  # an all-zero block
    q = quantized_x(x)
    for block in range(3):
        part = slice(32 * block, 32 * (block + 1))
        step = x[:, part].abs().amax(-1, keepdim=True) / 127
        assert torch.all((q[:, part] - x[:, part].double()).abs() <= step / 2 * (1 + 1e-6))
    assert torch.equal(q[1, 32:64], torch.zeros(32, dtype=torch.float64))


@needs_kernels
@pytest.mark.parametrize("rows", [1, 2, 8, 9, 16, 17, 40, 129, 300])
@pytest.mark.parametrize(("n", "k"), SHAPES)
def test_int8_linear_equals_f_linear_over_the_dequantized_weight_and_quantized_x(rows, n, k):
    assert KERNELS is not None
    torch.manual_seed(rows + n)
    x, w, bias = torch.randn(rows, k).bfloat16(), torch.randn(n, k).bfloat16(), torch.randn(n)
    x[0, : min(k, 32)] = 0.0  # an all-zero block of x
    weight = Int8PanelWeight.pack(w)
    for b in (None, bias.bfloat16()):
        out = KERNELS.linear(x, weight, b)
        expected = F.linear(
            quantized_x(x), dequantized(w).double(), None if b is None else b.double()
        )
        assert out.dtype == torch.bfloat16 and out.shape == (rows, n)
        # only the output's bf16 rounding apart: each block's dot product is exact in int32,
        # the blocks' sum is in fp32
        torch.testing.assert_close(out.double(), expected, atol=2e-2, rtol=8e-3)


@needs_kernels
def test_int8_linear_gives_a_row_the_same_bits_alone_and_batched():
    assert KERNELS is not None
    x, weight = torch.randn(200, 200).bfloat16(), Int8PanelWeight.pack(torch.randn(70, 200))
    together = KERNELS.linear(x, weight, None)
    for i in (0, 5, 17, 130, 199):
        assert torch.equal(KERNELS.linear(x[i : i + 1], weight, None)[0], together[i])
        assert torch.equal(KERNELS.linear(x[i : i + 9], weight, None)[0], together[i])


@pytest.mark.parametrize(("n", "k"), SHAPES)
def test_int8_weight_gives_rows_as_the_dequantized_weight_in_bf16(n, k):
    w = torch.randn(n, k)
    weight, expected = Int8PanelWeight.pack(w), dequantized(w).bfloat16()
    ids = torch.tensor([0, n - 1, n // 2, 0])
    assert torch.equal(weight.rows(ids), expected[ids])
    # a byte a value, K padded to whole blocks of 32 and N to whole panels of 16
    assert weight.panels.dtype == torch.uint8
    assert weight.panels.numel() == (n + 15) // 16 * 16 * ((k + 31) // 32 * 32)


@needs_kernels
def test_int8_linear_takes_a_byte_a_value_and_computes_for_few_rows_and_many():
    assert KERNELS is not None
    w, bias = torch.randn(50, 72).bfloat16(), torch.randn(50).bfloat16()
    linear = Int8Linear(w, bias, KERNELS)
    # 64 padded rows of 96 bytes (72 inputs padded to whole blocks), 64 fp32 scales, the bias
    assert linear.nbytes == 64 * 96 + 64 * 4 + 50 * 2
    for rows in (3, 200):  # our kernel at every row count
        x = torch.randn(rows, 72).bfloat16()
        expected = F.linear(quantized_x(x), dequantized(w).double(), bias.double())
        torch.testing.assert_close(linear(x).double(), expected, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_fallback_dequantizes_at_each_call_in_the_model_dtype(dtype):
    w, bias = torch.randn(30, 40).to(dtype), torch.randn(30).to(dtype)
    linear = DequantizingLinear(w, bias)
    x = torch.randn(5, 40).to(dtype)
    expected = F.linear(x, dequantized(w).to(dtype), bias)
    torch.testing.assert_close(linear(x), expected)
    ids = torch.tensor([3, 29])
    torch.testing.assert_close(linear.rows(ids), dequantized(w).to(dtype)[ids])
    assert linear.nbytes == 30 * 40 + 30 * 4 + 30 * w.element_size()  # q, scales, bias


def test_int8_without_our_kernels_or_on_another_device_falls_back_to_dequantizing():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert linear_factory(cpu, torch.bfloat16, None, "int8") is DequantizingLinear
    assert linear_factory(cpu, torch.float32, KERNELS, "int8") is DequantizingLinear
    assert linear_factory(cuda, torch.bfloat16, KERNELS, "int8") is DequantizingLinear


def test_an_unknown_weight_format_is_refused_naming_the_setting():
    config, weights = tiny_llama(tied=True)
    with pytest.raises(ModelLoadFailed, match="weights 'int4'"):
        TorchRunner(config, weights, block_tokens=16, cache_budget_mb=1, weight_format="int4")


@needs_kernels
@pytest.mark.parametrize("tied", [True, False])
def test_int8_model_with_our_kernels_matches_the_dequantizing_fallback(tied):
    config, weights = tiny_llama(tied)
    runners = [
        TorchRunner(
            config,
            weights,
            block_tokens=16,
            cache_budget_mb=8,
            dtype="bfloat16",
            kernels=on,
            weight_format="int8",
        )
        for on in (True, False)
    ]
    assert isinstance(runners[1].model.lm_head, DequantizingLinear)
    # first chunks of 23 and 150 rows, then a row each
    prompts = [[random.Random(s).randrange(300) for _ in range(n)] for s, n in ((1, 23), (2, 150))]
    ours, fallback = (step_logits(r, prompts, steps=4) for r in runners)
    for a, b in zip(ours, fallback, strict=True):
        torch.testing.assert_close(a, b, atol=5e-2, rtol=5e-2)
