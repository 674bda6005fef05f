"""Q6_K blocks unpacked without dequantizing: the same values as the `gguf` package's
dequantizer, bit for bit, and rows that reorder as the loader needs."""

from __future__ import annotations

import functools

import numpy as np
from gguf import GGMLQuantizationType, quants

from semantic.models.gguf import unpermute_rope_rows
from semantic.models.q4k import SUPER
from semantic.models.q6k import BLOCK_BYTES, read_q6k


def random_q6k(rows: int, cols: int, seed: int = 0) -> np.ndarray:
    """A Q6_K tensor's bytes: every bit random but d, a finite fp16."""
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, (rows * cols // SUPER, BLOCK_BYTES), dtype=np.uint8)
    d = rng.uniform(1e-5, 1e-3, (blocks.shape[0], 1)).astype(np.float16)
    blocks[:, -2:] = d.view(np.uint8)
    return blocks.reshape(-1)


def test_unpacked_blocks_dequantize_to_the_gguf_packages_floats_bit_for_bit() -> None:
    rows, cols = 40, 768
    data = random_q6k(rows, cols)
    blocks = read_q6k(data, rows, cols)
    expected = quants.dequantize(data, GGMLQuantizationType.Q6_K).reshape(rows, cols)
    assert blocks.u.dtype == np.uint8 and blocks.u.max() == 63
    assert blocks.sc.shape == (rows, cols // 16) and blocks.d.shape == (rows, cols // 256)
    np.testing.assert_array_equal(blocks.dequantize(), expected)


def test_reordered_rows_keep_their_scales() -> None:
    rows, cols = 32, 256
    blocks = read_q6k(random_q6k(rows, cols, seed=2), rows, cols)
    unpermute = functools.partial(unpermute_rope_rows, num_heads=4)
    np.testing.assert_array_equal(
        blocks.with_rows(unpermute).dequantize(), unpermute(blocks.dequantize())
    )
