"""The per-32 block types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) unpacked without dequantizing: the same
values as the `gguf` package's dequantizer, bit for bit; rows that reorder as the loader needs;
parts of one fused projection kept as blocks where their values allow it exactly."""

from __future__ import annotations

import functools

import numpy as np
import pytest
from gguf import GGMLQuantizationType, quants

from semantic.models.gguf import unpermute_rope_rows
from semantic.models.q32 import GROUP, READERS, Q32Blocks

BLOCK_BYTES = {"Q4_0": 18, "Q4_1": 20, "Q5_0": 22, "Q5_1": 24, "Q8_0": 34}
KINDS = list(BLOCK_BYTES)


def random_q32(kind: str, rows: int, cols: int, seed: int = 0) -> np.ndarray:
    """A per-32 tensor's bytes: every bit random but d (and m), finite fp16s of either sign."""
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, (rows * cols // GROUP, BLOCK_BYTES[kind]), dtype=np.uint8)
    factors = 2 if kind.endswith("_1") else 1
    scales = rng.uniform(-1e-2, 1e-2, (blocks.shape[0], factors)).astype(np.float16)
    blocks[:, : 2 * factors] = scales.view(np.uint8)
    return blocks.reshape(-1)


def read(kind: str, rows: int, cols: int, seed: int = 0) -> Q32Blocks:
    return READERS[kind](random_q32(kind, rows, cols, seed), rows, cols)


@pytest.mark.parametrize("kind", KINDS)
def test_unpacked_blocks_dequantize_to_the_gguf_packages_floats_bit_for_bit(kind: str) -> None:
    rows, cols = 40, 96
    data = random_q32(kind, rows, cols)
    blocks = READERS[kind](data, rows, cols)
    expected = quants.dequantize(data, GGMLQuantizationType[kind]).reshape(rows, cols)
    assert blocks.u.dtype == np.uint8 and int(blocks.u.max()) == 2**blocks.bits - 1
    assert blocks.d.shape == (rows, cols // GROUP)
    assert (blocks.m is not None) == kind.endswith("_1")
    np.testing.assert_array_equal(blocks.dequantize().view(np.uint32), expected.view(np.uint32))


@pytest.mark.parametrize("kind", KINDS)
def test_reordered_rows_keep_their_factors(kind: str) -> None:
    rows, cols = 32, 64
    blocks = read(kind, rows, cols, seed=2)
    unpermute = functools.partial(unpermute_rope_rows, num_heads=4)
    np.testing.assert_array_equal(
        blocks.with_rows(unpermute).dequantize(), unpermute(blocks.dequantize())
    )


def test_symmetric_parts_of_two_types_fuse_in_8_bits_exactly() -> None:
    """The 0.5B's Q5_0 Q and K beside its Q8_0 V: one 8-bit matrix of the same values."""
    parts = [read("Q5_0", 16, 64, 1), read("Q4_0", 8, 64, 2), read("Q8_0", 8, 64, 3)]
    fused = Q32Blocks.concat(parts)
    assert fused is not None and (fused.bits, fused.offset, fused.m) == (8, 128, None)
    expected = np.concatenate([p.dequantize() for p in parts])
    np.testing.assert_array_equal(fused.dequantize(), expected)


def test_parts_of_one_type_fuse_as_they_are_and_affine_with_others_do_not() -> None:
    same = Q32Blocks.concat([read("Q4_1", 16, 64, 1), read("Q4_1", 8, 64, 2)])
    assert same is not None and (same.bits, same.offset) == (4, 0) and same.m is not None
    assert same.u.shape == (24, 64)
    assert Q32Blocks.concat([read("Q4_1", 16, 64, 1), read("Q4_0", 8, 64, 2)]) is None
    with pytest.raises(ValueError, match="symmetric"):
        read("Q5_1", 16, 64).widened()
