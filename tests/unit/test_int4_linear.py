"""The torch backend's int4 linear on Q4_K blocks: torch's kernel and our dequantized slabs both
compute x Wᵀ for the file's W (its group scales and zeros rounded to bf16), a layer's weights
stay blocks where all of them are, the file's other tensors are kept in bf16 beside an fp32
model, and `weights = "auto"` picks the format by machine."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from semantic.backends import weight_format
from semantic.backends.torch import int4, runner
from semantic.backends.torch import linear as linear_module
from semantic.backends.torch.int4 import Int4Linear, runs_int4
from semantic.backends.torch.linear import Bf16StoredLinear, linear_factory
from semantic.backends.torch.models.layers import Build
from semantic.backends.torch.models.weights import Weights
from semantic.models.config import ModelConfig
from semantic.models.q4k import Q4KBlocks, read_q4k
from semantic.settings.options import runner_options
from semantic.settings.settings import Settings
from tests.unit.test_q4k import random_q4k

OUT, IN = 96, 512


def blocks(rows: int = OUT, cols: int = IN, seed: int = 0) -> Q4KBlocks:
    return read_q4k(random_q4k(rows, cols, seed), rows, cols)


def file_weight(b: Q4KBlocks) -> torch.Tensor:
    return torch.from_numpy(b.dequantize())


def test_the_weight_is_the_files_up_to_bf16_scales_and_zeros() -> None:
    """Each value q·scale − min within 15 scales' and a zero's bf16 rounding (2⁻⁸ of each, the
    only rounding: the file's scale d·sc and zero 8·scale − dmin·m to bf16)."""
    b = blocks()
    linear = Int4Linear(b, None, torch.float32)
    scales = torch.from_numpy(b.scales).repeat_interleave(32, 1)
    zeros = 8 * scales - torch.from_numpy(b.mins).repeat_interleave(32, 1)
    bound = (zeros.abs() + 15 * scales) * 2**-8 + 1e-6
    error = (linear.dequantized() - file_weight(b)).abs()
    assert torch.all(error <= bound)


@pytest.mark.parametrize("rows", [1, 7, 128])
def test_the_kernel_computes_the_dequantized_matmul_in_bf16(rows: int) -> None:
    b = blocks()
    linear = Int4Linear(b, None, torch.float32)
    x = torch.randn(rows, IN)
    y = linear(x)
    expected = F.linear(x.bfloat16().float(), linear.dequantized())
    assert y.dtype == torch.float32 and y.shape == (rows, OUT)
    scale = expected.abs().max()
    torch.testing.assert_close(y, expected, atol=float(scale) * 2**-7, rtol=2**-7)


def test_the_slabs_compute_the_dequantized_matmul_in_the_models_dtype(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(linear_module, "SLAB_ROWS", 32)  # three slabs of 96 output rows
    b = blocks()
    bias = torch.randn(OUT)
    linear = Int4Linear(b, bias, torch.float32)
    x = torch.randn(int4._KERNEL_MAX_ROWS + 1, IN)
    expected = F.linear(x, linear.dequantized(), bias)  # the same fp32 sums, in another order
    torch.testing.assert_close(linear(x), expected, atol=1e-4, rtol=1e-4)


def test_the_kernel_adds_the_bias() -> None:
    b, bias = blocks(), torch.randn(OUT)
    x = torch.randn(2, IN)
    with_bias = Int4Linear(b, bias, torch.float32)(x)
    torch.testing.assert_close(with_bias, Int4Linear(b, None, torch.float32)(x) + bias)


def test_rows_are_the_dequantized_weights_rows() -> None:
    linear = Int4Linear(blocks(), None, torch.float32, kernel=False)
    ids = torch.tensor([5, 0, 95, 5])
    assert linear.packed is None
    torch.testing.assert_close(linear.rows(ids), linear.dequantized()[ids], rtol=0, atol=0)


def test_packing_in_slabs_of_rows_is_packing_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    b = blocks(rows=256)
    whole = Int4Linear(b, None, torch.float32).packed
    monkeypatch.setattr(int4, "_PACK_ROWS", 64)
    slabs = Int4Linear(b, None, torch.float32).packed
    assert whole is not None and slabs is not None and torch.equal(whole, slabs)


def test_the_linears_bytes_are_about_a_byte_a_value() -> None:
    linear = Int4Linear(blocks(), None, torch.float32)
    assert linear.nbytes == OUT * IN * (0.5 + 0.5 + 4 / 32)


def test_shapes_the_kernel_does_not_take_are_left_dense() -> None:
    cpu = torch.device("cpu")
    assert runs_int4(blocks(), cpu)
    assert not runs_int4(blocks(rows=40), cpu)  # rows in 16s
    assert not runs_int4(blocks(), torch.device("meta"))


def build(dtype: torch.dtype = torch.float32) -> Build:
    config = ModelConfig(
        model_type="qwen2",
        vocab_size=128,
        hidden_size=IN,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=IN // 4,
        max_position_embeddings=64,
    )
    cpu = torch.device("cpu")
    return Build(config, dtype, cpu, linear_factory(cpu, dtype, None, "gguf"), None, "gguf")


def test_a_fused_weight_stays_blocks_only_where_every_part_is() -> None:
    dense = np.random.default_rng(0).standard_normal((32, IN)).astype(np.float32)
    arrays: list[tuple[str, np.ndarray | Q4KBlocks]] = [
        ("a", blocks(32, seed=1)),
        ("b", blocks(32, seed=2)),
        ("c", dense),
    ]
    weights = Weights.load([*arrays, ("d", blocks(32, seed=3))], build())
    fused = weights.fused(["a", "b"])
    assert isinstance(weights.linear(fused, None), Int4Linear)
    mixed = weights.fused(["c", "d"])
    stored = weights.linear(mixed, None)  # the others of a GGUF in bf16, for an fp32 model
    assert isinstance(mixed, torch.Tensor) and isinstance(stored, Bf16StoredLinear)
    np.testing.assert_array_equal(mixed[32:].numpy(), blocks(32, seed=3).dequantize())


def test_a_layer_that_takes_a_tensor_gets_the_blocks_values() -> None:
    weights = Weights.load([("w", blocks(32))], build())
    np.testing.assert_array_equal(weights.take("w").numpy(), blocks(32).dequantize())


@pytest.mark.parametrize("ours", [None, object()], ids=["avx2", "avx512"])
def test_auto_computes_a_gguf_on_its_blocks_on_any_cpu(
    monkeypatch: pytest.MonkeyPatch, ours: object
) -> None:
    monkeypatch.setattr(runner, "pick_cpu_kernels", lambda *args: ours)
    options = runner_options(Settings(backend="torch", device="cpu"))
    assert weight_format(options, gguf=True) == "gguf"
    assert weight_format(options, gguf=False) == "bf16"
    # a file without Q4_K (SmolLM2's Q4_1): as loaded, unless asked (its answers move)
    assert weight_format(options, gguf=True, k_blocks=False) == "bf16"
    assert weight_format(runner_options(Settings(weights="int8")), gguf=True) == "int8"
    on_cuda = runner_options(Settings(backend="torch", device="cuda"))
    monkeypatch.setattr(runner, "pick_device", lambda device: torch.device(device))
    assert weight_format(on_cuda, gguf=True) == "bf16"


@pytest.mark.parametrize("rows", [1, 5])
def test_a_bf16_stored_weight_computes_its_bf16_values(rows: int) -> None:
    """The other tensors of a GGUF beside an fp32 model: stored in bf16 (half the bytes), one
    row on the bf16 GEMV (x rounded to bf16 too), more on the weight widened to fp32."""
    weight, bias = torch.randn(OUT, IN), torch.randn(OUT)
    linear = Bf16StoredLinear(weight, bias)
    x = torch.randn(rows, IN)
    rounded = weight.bfloat16().float()
    x_seen = x.bfloat16().float() if rows == 1 else x
    y = linear(x)
    assert y.dtype == torch.float32 and linear.nbytes == (OUT * IN * 2 + OUT * 4)
    torch.testing.assert_close(y, F.linear(x_seen, rounded, bias), atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(linear.rows(torch.tensor([3, 1])), rounded[[3, 1]])
