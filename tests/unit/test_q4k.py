"""Q4_K and Q5_K blocks unpacked without dequantizing: the same values as the `gguf` package's
dequantizer, bit for bit, and rows that reorder and stack as the loader needs."""

from __future__ import annotations

import functools

import numpy as np
from gguf import GGMLQuantizationType, quants

from semantic.models.gguf import unpermute_rope_rows
from semantic.models.q4k import BLOCK_BYTES, Q5K_BLOCK_BYTES, SUPER, Q4KBlocks, read_q4k, read_q5k


def random_q4k(rows: int, cols: int, seed: int = 0, block_bytes: int = BLOCK_BYTES) -> np.ndarray:
    """A Q4_K tensor's bytes (Q5_K's with its `block_bytes`): every bit random but d and dmin,
    which are finite fp16."""
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, (rows * cols // SUPER, block_bytes), dtype=np.uint8)
    scales = rng.uniform(1e-4, 0.05, (blocks.shape[0], 2)).astype(np.float16)
    blocks[:, :4] = scales.view(np.uint8)
    return blocks.reshape(-1)


def test_unpacked_blocks_dequantize_to_the_gguf_packages_floats_bit_for_bit() -> None:
    rows, cols = 48, 768
    data = random_q4k(rows, cols)
    blocks = read_q4k(data, rows, cols)
    expected = quants.dequantize(data, GGMLQuantizationType.Q4_K).reshape(rows, cols)
    assert blocks.q.dtype == np.uint8 and blocks.q.max() <= 15
    assert blocks.scales.shape == blocks.mins.shape == (rows, cols // 32)
    np.testing.assert_array_equal(blocks.dequantize(), expected)


def random_q5k(rows: int, cols: int, seed: int = 0) -> np.ndarray:
    return random_q4k(rows, cols, seed, Q5K_BLOCK_BYTES)


def test_q5k_blocks_are_q4ks_with_a_fifth_bit_bit_for_bit() -> None:
    rows, cols = 48, 768
    data = random_q5k(rows, cols, seed=1)
    blocks = read_q5k(data, rows, cols)
    expected = quants.dequantize(data, GGMLQuantizationType.Q5_K).reshape(rows, cols)
    assert blocks.bits == 5 and blocks.q.max() == 31 and blocks.q.min() == 0
    np.testing.assert_array_equal(blocks.dequantize(), expected)
    reordered = blocks.with_rows(lambda a: a[::-1])
    assert reordered.bits == 5
    np.testing.assert_array_equal(reordered.dequantize(), expected[::-1])


def test_a_q4k_and_a_q5k_do_not_stack_as_blocks() -> None:
    a = read_q4k(random_q4k(16, 256, seed=3), 16, 256)
    b = read_q5k(random_q5k(16, 256, seed=4), 16, 256)
    assert Q4KBlocks.concat([a, b]) is None
    stacked = Q4KBlocks.concat([b, b])
    assert stacked is not None and stacked.bits == 5 and stacked.shape == (32, 256)


def test_reordered_rows_keep_their_scales() -> None:
    rows, cols = 32, 256
    blocks = read_q4k(random_q4k(rows, cols, seed=2), rows, cols)
    unpermute = functools.partial(unpermute_rope_rows, num_heads=4)
    np.testing.assert_array_equal(
        blocks.with_rows(unpermute).dequantize(), unpermute(blocks.dequantize())
    )


def test_stacked_blocks_are_the_parts_rows_in_order() -> None:
    a = read_q4k(random_q4k(16, 256, seed=3), 16, 256)
    b = read_q4k(random_q4k(32, 256, seed=4), 32, 256)
    stacked = Q4KBlocks.concat([a, b])
    assert stacked is not None and stacked.shape == (48, 256)
    np.testing.assert_array_equal(
        stacked.dequantize(), np.concatenate([a.dequantize(), b.dequantize()])
    )
