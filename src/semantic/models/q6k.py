"""A Q6_K tensor as its blocks hold it, unpacked but not dequantized (the torch backend's group
kernel computes on them: `backends/torch/blocks.py`), and `Blocks`, any kind of block a GGUF
file hands a backend that computes on them (the K-quants' and the per-32 ones: `q32.py`).

A Q6_K block is 256 values of one row in 210 bytes: 128 bytes of low nibbles `ql`, 64 of high
two-bit pairs `qh`, sixteen int8 scales `sc` (one per 16 values) and an fp16 `d`; a value is
`d·sc·(u − 32)` with u = low | high << 4 in 0..63 (llama.cpp's `dequantize_row_q6_K`, the
`gguf` package's `Q6_K`). Unpacked, each 16 values keep their `scale = d·sc`, exact in fp32
(11 significant bits times 8), so `dequantize()` gives the `gguf` package's floats bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from semantic.models.q4k import SUPER, Q4KBlocks, RowReorder
from semantic.models.q32 import Q32Blocks

HALF = 16  # values sharing one scale
BLOCK_BYTES = 210
_OFFSET = 32  # u − 32: the signed value


@dataclass(slots=True, frozen=True)
class Q6KBlocks:
    """A [rows, cols] Q6_K tensor: `u` [rows, cols] uint8 in 0..63; `d` [rows, cols / 256]
    float32, a block's; `sc` [rows, cols / 16] int8, each 16 values'. value = d · sc · (u − 32)."""

    u: np.ndarray
    d: np.ndarray
    sc: np.ndarray

    @property
    def shape(self) -> tuple[int, int]:
        rows, cols = self.u.shape
        return rows, cols

    def dequantize(self) -> np.ndarray:
        """float32 [rows, cols], as the file's dequantizer computes it."""
        rows, cols = self.shape
        scales = np.repeat(self.d, SUPER // HALF, axis=1) * self.sc.astype(np.float32)
        values = self.u.reshape(rows, cols // HALF, HALF).astype(np.int8) - np.int8(_OFFSET)
        return (scales[..., None] * values.astype(np.float32)).reshape(rows, cols)

    def with_rows(self, reorder: RowReorder) -> Q6KBlocks:
        """The same values with rows reordered (a Q/K permutation undone)."""
        return Q6KBlocks(reorder(self.u), reorder(self.d), reorder(self.sc))


# the blocks a GGUF hands a backend that computes on them
Blocks = Q4KBlocks | Q6KBlocks | Q32Blocks


def read_q6k(data: np.ndarray, rows: int, cols: int) -> Q6KBlocks:
    """A Q6_K tensor's bytes (uint8, `rows · cols / 256` blocks) unpacked."""
    blocks = np.asarray(data, dtype=np.uint8).reshape(rows * cols // SUPER, BLOCK_BYTES)
    n = blocks.shape[0]
    ql, qh = blocks[:, :128], blocks[:, 128:192]
    sc = blocks[:, 192:208].view(np.int8).reshape(rows, cols // HALF)
    d = blocks[:, 208:210].view(np.float16).astype(np.float32).reshape(rows, cols // SUPER)
    # Each half block (128 values) takes 64 bytes of ql and 32 of qh: value 32j + l of the half
    # has ql[l + 32·(j % 2)]'s low (j < 2) or high nibble, and qh[l]'s bits 2j, 2j + 1.
    low = ql.reshape(n, 2, 1, 64) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)
    low = (low & np.uint8(0x0F)).reshape(n, 2, 4, 32)
    high = qh.reshape(n, 2, 1, 32) >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)
    u = low | ((high & np.uint8(0x03)) << np.uint8(4))
    return Q6KBlocks(u.reshape(rows, cols), d, np.ascontiguousarray(sc))
