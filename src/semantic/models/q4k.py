"""A Q4_K tensor as its blocks hold it, unpacked but not dequantized: what a backend that computes
on 4-bit groups (the torch backend's `weights = "gguf"`) takes from a GGUF file.

A Q4_K block is 256 values of one row in 144 bytes: fp16 `d` and `dmin`, twelve bytes of 6-bit
scales `sc` and mins `m` for its eight 32-value groups, then 128 bytes of 4-bit values `q`; a value
is `d·sc·q − dmin·m` (llama.cpp's `dequantize_row_q4_K`, the `gguf` package's `Q4_K`). Unpacked,
each group keeps its `scale = d·sc` and `min = dmin·m` in fp32, so `dequantize()` gives the `gguf`
package's floats bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

GROUP = 32  # values sharing one scale and min
SUPER = 256  # values per block
BLOCK_BYTES = 144
_SCALE_BYTES = 12

RowReorder = Callable[[np.ndarray], np.ndarray]  # a rows-first array → its rows reordered


@dataclass(slots=True, frozen=True)
class Q4KBlocks:
    """A [rows, cols] Q4_K tensor: `q` [rows, cols] uint8 in 0..15, `scales` and `mins`
    [rows, cols / 32] float32; value = scale · q − min, per 32-value group of a row."""

    q: np.ndarray
    scales: np.ndarray
    mins: np.ndarray

    @property
    def shape(self) -> tuple[int, int]:
        rows, cols = self.q.shape
        return rows, cols

    def dequantize(self) -> np.ndarray:
        """float32 [rows, cols], as the file's dequantizer computes it."""
        rows, cols = self.shape
        groups = self.q.reshape(rows, cols // GROUP, GROUP).astype(np.float32)
        values = self.scales[..., None] * groups - self.mins[..., None]
        return values.reshape(rows, cols)

    def with_rows(self, reorder: RowReorder) -> Q4KBlocks:
        """The same values with rows reordered (a Q/K permutation undone): a group never
        crosses rows, so its scale and min move with it."""
        return Q4KBlocks(reorder(self.q), reorder(self.scales), reorder(self.mins))

    @staticmethod
    def concat(parts: list[Q4KBlocks]) -> Q4KBlocks:
        """Tensors of one width stacked by rows (a fused QKV or gate-up projection)."""
        return Q4KBlocks(
            np.concatenate([p.q for p in parts]),
            np.concatenate([p.scales for p in parts]),
            np.concatenate([p.mins for p in parts]),
        )


def read_q4k(data: np.ndarray, rows: int, cols: int) -> Q4KBlocks:
    """A Q4_K tensor's bytes (uint8, `rows · cols / 256` blocks) unpacked."""
    blocks = np.asarray(data, dtype=np.uint8).reshape(rows * cols // SUPER, BLOCK_BYTES)
    d = blocks[:, 0:2].view(np.float16).astype(np.float32)  # [B, 1]
    dmin = blocks[:, 2:4].view(np.float16).astype(np.float32)
    sc, m = _scales_and_mins(blocks[:, 4 : 4 + _SCALE_BYTES])  # [B, 8] each
    scales = (d * sc.astype(np.float32)).reshape(rows, cols // GROUP)
    mins = (dmin * m.astype(np.float32)).reshape(rows, cols // GROUP)
    # Each 32 bytes hold two groups: the first in the low nibbles, the next in the high.
    packed = blocks[:, 4 + _SCALE_BYTES :].reshape(-1, SUPER // 64, 1, GROUP)
    q = (packed >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)) & np.uint8(0x0F)
    return Q4KBlocks(q.reshape(rows, cols), scales, mins)


def _scales_and_mins(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Twelve bytes → eight 6-bit scales and eight 6-bit mins. Bytes 0-3 hold scales 0-3 in
    their low six bits, 4-7 mins 0-3; scales and mins 4-7 take their low four bits from bytes
    8-11 (low and high nibble) and their top two from the top bits of bytes 0-3 and 4-7."""
    low, high, rest = packed[:, 0:4], packed[:, 4:8], packed[:, 8:12]
    sc = np.concatenate([low & 0x3F, (rest & 0x0F) | ((low >> 2) & 0x30)], axis=-1)
    m = np.concatenate([high & 0x3F, (rest >> 4) | ((high >> 2) & 0x30)], axis=-1)
    return sc, m
