"""A Q4_K tensor as its blocks hold it, unpacked but not dequantized: what a backend that computes
on 4-bit groups (the torch backend's `weights = "gguf"`) takes from a GGUF file.

A Q4_K block is 256 values of one row in 144 bytes: fp16 `d` and `dmin`, twelve bytes of 6-bit
scales `sc` and mins `m` for its eight 32-value groups, then 128 bytes of 4-bit values `q`; a value
is `d·sc·q − dmin·m` (llama.cpp's `dequantize_row_q4_K`, the `gguf` package's `Q4_K`). Unpacked,
each block keeps `d` and `dmin` in fp32 and each group its codes `sc` and `m`; a group's `scale =
d·sc` and `min = dmin·m` are exact in fp32 (11 significant bits times 6), so `dequantize()` gives
the `gguf` package's floats bit for bit. Our AVX-512 kernel reads the codes as the file holds them
(`backends/torch/blocks.py`); torch's int4 kernel takes the fp32 scales and mins.
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
    """A [rows, cols] Q4_K tensor: `q` [rows, cols] uint8 in 0..15; `d` and `dmin` [rows,
    cols / 256] float32, a block's; `sc` and `m` [rows, cols / 32] uint8 in 0..63, a group's
    codes. value = scale · q − min per 32-value group of a row, scale = d · sc, min = dmin · m."""

    q: np.ndarray
    d: np.ndarray
    dmin: np.ndarray
    sc: np.ndarray
    m: np.ndarray

    @property
    def shape(self) -> tuple[int, int]:
        rows, cols = self.q.shape
        return rows, cols

    @property
    def scales(self) -> np.ndarray:
        """float32 [rows, cols / 32]: each group's d · sc (exact)."""
        return _per_group(self.d, self.sc)

    @property
    def mins(self) -> np.ndarray:
        """float32 [rows, cols / 32]: each group's dmin · m (exact)."""
        return _per_group(self.dmin, self.m)

    def dequantize(self) -> np.ndarray:
        """float32 [rows, cols], as the file's dequantizer computes it."""
        rows, cols = self.shape
        groups = self.q.reshape(rows, cols // GROUP, GROUP).astype(np.float32)
        values = self.scales[..., None] * groups - self.mins[..., None]
        return values.reshape(rows, cols)

    def with_rows(self, reorder: RowReorder) -> Q4KBlocks:
        """The same values with rows reordered (a Q/K permutation undone): a group never
        crosses rows, so its scale and min move with it."""
        return Q4KBlocks(*(reorder(a) for a in self._arrays()))

    @staticmethod
    def concat(parts: list[Q4KBlocks]) -> Q4KBlocks:
        """Tensors of one width stacked by rows (a fused QKV or gate-up projection)."""
        columns = zip(*(p._arrays() for p in parts), strict=True)
        return Q4KBlocks(*(np.concatenate(arrays) for arrays in columns))

    def _arrays(self) -> tuple[np.ndarray, ...]:
        return self.q, self.d, self.dmin, self.sc, self.m


def _per_group(per_block: np.ndarray, codes: np.ndarray) -> np.ndarray:
    """A block's factor times each of its groups' codes, float32 [rows, groups]."""
    return np.repeat(per_block, SUPER // GROUP, axis=1) * codes.astype(np.float32)


def read_q4k(data: np.ndarray, rows: int, cols: int) -> Q4KBlocks:
    """A Q4_K tensor's bytes (uint8, `rows · cols / 256` blocks) unpacked."""
    blocks = np.asarray(data, dtype=np.uint8).reshape(rows * cols // SUPER, BLOCK_BYTES)
    d = blocks[:, 0:2].view(np.float16).astype(np.float32).reshape(rows, cols // SUPER)
    dmin = blocks[:, 2:4].view(np.float16).astype(np.float32).reshape(rows, cols // SUPER)
    sc, m = _scales_and_mins(blocks[:, 4 : 4 + _SCALE_BYTES])  # [B, 8] each
    # Each 32 bytes hold two groups: the first in the low nibbles, the next in the high.
    packed = blocks[:, 4 + _SCALE_BYTES :].reshape(-1, SUPER // 64, 1, GROUP)
    q = (packed >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)) & np.uint8(0x0F)
    groups = (rows, cols // GROUP)
    return Q4KBlocks(q.reshape(rows, cols), d, dmin, sc.reshape(groups), m.reshape(groups))


def _scales_and_mins(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Twelve bytes → eight 6-bit scales and eight 6-bit mins. Bytes 0-3 hold scales 0-3 in
    their low six bits, 4-7 mins 0-3; scales and mins 4-7 take their low four bits from bytes
    8-11 (low and high nibble) and their top two from the top bits of bytes 0-3 and 4-7."""
    low, high, rest = packed[:, 0:4], packed[:, 4:8], packed[:, 8:12]
    sc = np.concatenate([low & 0x3F, (rest & 0x0F) | ((low >> 2) & 0x30)], axis=-1)
    m = np.concatenate([high & 0x3F, (rest >> 4) | ((high >> 2) & 0x30)], axis=-1)
    return sc, m
