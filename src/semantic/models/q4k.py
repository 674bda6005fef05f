"""A Q4_K or Q5_K tensor as its blocks hold it, unpacked but not dequantized: what a backend that
computes on the K-quants' groups (the torch backend's `weights = "gguf"`) takes from a GGUF file.

A Q4_K block is 256 values of one row in 144 bytes: fp16 `d` and `dmin`, twelve bytes of 6-bit
scales `sc` and mins `m` for its eight 32-value groups, then 128 bytes of 4-bit values `q`; a value
is `d·sc·q − dmin·m` (llama.cpp's `dequantize_row_q4_K`, the `gguf` package's `Q4_K`). A Q5_K block
is the same with a fifth bit to each value, in 176 bytes: `d`, `dmin`, the twelve bytes of codes,
32 bytes of fifth bits (value j of group g in bit g of byte j), then the 128 bytes of low nibbles
laid out as Q4_K's (`dequantize_row_q5_K`). Unpacked, each block keeps `d` and `dmin` in fp32 and
each group its codes `sc` and `m`; a group's `scale = d·sc` and `min = dmin·m` are exact in fp32
(11 significant bits times 6), so `dequantize()` gives the `gguf` package's floats bit for bit.
Our AVX-512 kernel reads the codes as the file holds them (`backends/torch/blocks.py`); torch's
int4 kernel takes a Q4_K's fp32 scales and mins.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np

GROUP = 32  # values sharing one scale and min
SUPER = 256  # values per block
BLOCK_BYTES = 144
Q5K_BLOCK_BYTES = 176
_SCALE_BYTES = 12
_FIFTH_BYTES = 32

RowReorder = Callable[[np.ndarray], np.ndarray]  # a rows-first array → its rows reordered


@dataclass(slots=True, frozen=True)
class Q4KBlocks:
    """A [rows, cols] Q4_K tensor (or Q5_K: `bits` 5): `q` [rows, cols] uint8 in 0..15 (0..31);
    `d` and `dmin` [rows, cols / 256] float32, a block's; `sc` and `m` [rows, cols / 32] uint8
    in 0..63, a group's codes. value = scale · q − min per 32-value group of a row, scale = d ·
    sc, min = dmin · m."""

    q: np.ndarray
    d: np.ndarray
    dmin: np.ndarray
    sc: np.ndarray
    m: np.ndarray
    bits: int = 4

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
        return self._of(reorder(a) for a in self._arrays())

    @staticmethod
    def concat(parts: list[Q4KBlocks]) -> Q4KBlocks | None:
        """Tensors of one width stacked by rows (a fused QKV or gate-up projection), or None
        where they differ in bits (a Q4_K and a Q5_K: to be dequantized)."""
        if len({p.bits for p in parts}) > 1:
            return None
        columns = zip(*(p._arrays() for p in parts), strict=True)
        return parts[0]._of(np.concatenate(arrays) for arrays in columns)

    def _arrays(self) -> tuple[np.ndarray, ...]:
        return self.q, self.d, self.dmin, self.sc, self.m

    def _of(self, arrays: Iterable[np.ndarray]) -> Q4KBlocks:
        """Other arrays (in `_arrays`' order) of this one's kind."""
        q, d, dmin, sc, m = arrays
        return Q4KBlocks(q, d, dmin, sc, m, self.bits)


def _per_group(per_block: np.ndarray, codes: np.ndarray) -> np.ndarray:
    """A block's factor times each of its groups' codes, float32 [rows, groups]."""
    return np.repeat(per_block, SUPER // GROUP, axis=1) * codes.astype(np.float32)


def read_q4k(data: np.ndarray, rows: int, cols: int) -> Q4KBlocks:
    """A Q4_K tensor's bytes (uint8, `rows · cols / 256` blocks) unpacked."""
    blocks = np.asarray(data, dtype=np.uint8).reshape(rows * cols // SUPER, BLOCK_BYTES)
    q = _nibbles(blocks[:, 4 + _SCALE_BYTES :])
    return _unpacked(blocks, q, rows, cols, bits=4)


def read_q5k(data: np.ndarray, rows: int, cols: int) -> Q4KBlocks:
    """A Q5_K tensor's bytes (uint8, `rows · cols / 256` blocks) unpacked."""
    blocks = np.asarray(data, dtype=np.uint8).reshape(rows * cols // SUPER, Q5K_BLOCK_BYTES)
    fifth_at = 4 + _SCALE_BYTES
    q = _nibbles(blocks[:, fifth_at + _FIFTH_BYTES :])  # [B, 8 groups, 32]
    fifth = blocks[:, None, fifth_at : fifth_at + _FIFTH_BYTES]  # [B, 1, 32]: bit g for group g
    groups = np.arange(SUPER // GROUP, dtype=np.uint8).reshape(1, -1, 1)
    q |= ((fifth >> groups) & np.uint8(1)) << np.uint8(4)
    return _unpacked(blocks, q, rows, cols, bits=5)


def _nibbles(packed: np.ndarray) -> np.ndarray:
    """[B, 128] bytes → [B, 8, 32] values: each 32 bytes hold two groups, the first in the low
    nibbles, the next in the high."""
    pairs = packed.reshape(-1, SUPER // 64, 1, GROUP)
    q = (pairs >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)) & np.uint8(0x0F)
    return q.reshape(-1, SUPER // GROUP, GROUP)


def _unpacked(blocks: np.ndarray, q: np.ndarray, rows: int, cols: int, bits: int) -> Q4KBlocks:
    """The blocks' d, dmin and codes (their first 16 bytes, as Q4_K and Q5_K lay them out) with
    their values `q` [B, 8, 32]."""
    d = blocks[:, 0:2].view(np.float16).astype(np.float32).reshape(rows, cols // SUPER)
    dmin = blocks[:, 2:4].view(np.float16).astype(np.float32).reshape(rows, cols // SUPER)
    sc, m = _scales_and_mins(blocks[:, 4 : 4 + _SCALE_BYTES])  # [B, 8] each
    groups = (rows, cols // GROUP)
    return Q4KBlocks(
        q.reshape(rows, cols), d, dmin, sc.reshape(groups), m.reshape(groups), bits=bits
    )


def _scales_and_mins(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Twelve bytes → eight 6-bit scales and eight 6-bit mins. Bytes 0-3 hold scales 0-3 in
    their low six bits, 4-7 mins 0-3; scales and mins 4-7 take their low four bits from bytes
    8-11 (low and high nibble) and their top two from the top bits of bytes 0-3 and 4-7."""
    low, high, rest = packed[:, 0:4], packed[:, 4:8], packed[:, 8:12]
    sc = np.concatenate([low & 0x3F, (rest & 0x0F) | ((low >> 2) & 0x30)], axis=-1)
    m = np.concatenate([high & 0x3F, (rest >> 4) | ((high >> 2) & 0x30)], axis=-1)
    return sc, m
