"""A GGUF tensor in one of the per-32 block types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) as its blocks hold
it, unpacked but not dequantized: what the torch backend's group kernel computes on
(`backends/torch/blocks.py`).

Each block is 32 values of one row with an fp16 `d` (and, in the `_1` types, an fp16 `m`) of
its own: a value is `d·(u − offset) + m`, u unsigned in 4 bits (Q4_x: sixteen bytes of nibbles,
value j in the low nibble of byte j, value 16 + j in the high one), 5 (Q5_x: the same nibbles
and a 32-bit word of fifth bits, bit j for value j) or 8 (Q8_0: signed bytes, kept here as u =
q + 128); offset 8 (Q4_0), 16 (Q5_0), 128 (Q8_0) or 0 with m (Q4_1, Q5_1). That is llama.cpp's
`dequantize_row_q4_0` and the rest, the `gguf` package's `Q4_0` and the rest; `dequantize()`
computes what the `gguf` package does, bit for bit: the product d·(u − offset) is exact in fp32,
and `+ m` rounds once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from semantic.models.q4k import RowReorder

GROUP = 32  # values per block
_BYTE_OFFSET = 128  # the 8-bit form's u = q + 128


@dataclass(slots=True, frozen=True)
class Q32Blocks:
    """A [rows, cols] tensor in per-32 blocks: `u` [rows, cols] uint8; `d` [rows, cols / 32]
    float16; `m` the same, or None (the symmetric `_0` types); `offset` and `bits` of the
    type. value = d · (u − offset) + m."""

    u: np.ndarray
    d: np.ndarray
    m: np.ndarray | None
    offset: int
    bits: int

    @property
    def shape(self) -> tuple[int, int]:
        rows, cols = self.u.shape
        return rows, cols

    def dequantize(self) -> np.ndarray:
        """float32 [rows, cols], as the file's dequantizer computes it."""
        rows, cols = self.shape
        u = self.u.reshape(rows, cols // GROUP, GROUP).astype(np.float32) - np.float32(self.offset)
        values = self.d.astype(np.float32)[..., None] * u
        if self.m is not None:
            values += self.m.astype(np.float32)[..., None]
        return values.reshape(rows, cols)

    def with_rows(self, reorder: RowReorder) -> Q32Blocks:
        """The same values with rows reordered (a Q/K permutation undone)."""
        m = None if self.m is None else reorder(self.m)
        return Q32Blocks(reorder(self.u), reorder(self.d), m, self.offset, self.bits)

    def widened(self) -> Q32Blocks:
        """A symmetric type's values in 8 bits, offset 128: the same values exactly."""
        if self.m is not None:
            raise ValueError("only the symmetric per-32 types widen to 8 bits")
        u = self.u.astype(np.int16) + (_BYTE_OFFSET - self.offset)
        return Q32Blocks(u.astype(np.uint8), self.d, None, _BYTE_OFFSET, 8)

    @staticmethod
    def concat(parts: list[Q32Blocks]) -> Q32Blocks | None:
        """Tensors of one width stacked by rows (a fused QKV or gate-up projection): as they are
        where all are of one type, in 8 bits where they are symmetric types that differ (the
        0.5B's Q5_0 Q and K with its Q8_0 V), else None (to be dequantized)."""
        kinds = {(p.offset, p.bits, p.m is None) for p in parts}
        if len(kinds) > 1:
            if any(p.m is not None for p in parts):
                return None
            parts = [p.widened() for p in parts]
        first = parts[0]
        m = None if first.m is None else np.concatenate([p.m for p in parts if p.m is not None])
        u, d = (np.concatenate([getattr(p, f) for p in parts]) for f in ("u", "d"))
        return Q32Blocks(u, d, m, first.offset, first.bits)


def _split(data: np.ndarray, rows: int, cols: int, block_bytes: int) -> np.ndarray:
    return np.asarray(data, dtype=np.uint8).reshape(rows * cols // GROUP, block_bytes)


def _halves(d: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """[B, 2] bytes of fp16 → float16 [rows, cols / 32]."""
    return np.ascontiguousarray(d).view(np.float16).reshape(rows, cols // GROUP)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """[B, 16] bytes → [B, 32] values: the low nibbles, then the high ones."""
    return np.concatenate([qs & np.uint8(0x0F), qs >> np.uint8(4)], axis=1)


def _fifth_bits(qh: np.ndarray) -> np.ndarray:
    """[B, 4] bytes (a little-endian word) → [B, 32]: bit j of the word at bit 4 of value j."""
    bits = np.unpackbits(np.ascontiguousarray(qh), axis=1, bitorder="little")
    return bits << np.uint8(4)


def read_q4_0(data: np.ndarray, rows: int, cols: int) -> Q32Blocks:
    blocks = _split(data, rows, cols, 18)
    u = _nibbles(blocks[:, 2:]).reshape(rows, cols)
    return Q32Blocks(u, _halves(blocks[:, :2], rows, cols), None, 8, 4)


def read_q4_1(data: np.ndarray, rows: int, cols: int) -> Q32Blocks:
    blocks = _split(data, rows, cols, 20)
    u = _nibbles(blocks[:, 4:]).reshape(rows, cols)
    d, m = _halves(blocks[:, :2], rows, cols), _halves(blocks[:, 2:4], rows, cols)
    return Q32Blocks(u, d, m, 0, 4)


def read_q5_0(data: np.ndarray, rows: int, cols: int) -> Q32Blocks:
    blocks = _split(data, rows, cols, 22)
    u = (_nibbles(blocks[:, 6:]) | _fifth_bits(blocks[:, 2:6])).reshape(rows, cols)
    return Q32Blocks(u, _halves(blocks[:, :2], rows, cols), None, 16, 5)


def read_q5_1(data: np.ndarray, rows: int, cols: int) -> Q32Blocks:
    blocks = _split(data, rows, cols, 24)
    u = (_nibbles(blocks[:, 8:]) | _fifth_bits(blocks[:, 4:8])).reshape(rows, cols)
    d, m = _halves(blocks[:, :2], rows, cols), _halves(blocks[:, 2:4], rows, cols)
    return Q32Blocks(u, d, m, 0, 5)


def read_q8_0(data: np.ndarray, rows: int, cols: int) -> Q32Blocks:
    blocks = _split(data, rows, cols, 34)
    u = (blocks[:, 2:] ^ np.uint8(0x80)).reshape(rows, cols)  # q + 128 of a signed byte
    return Q32Blocks(u, _halves(blocks[:, :2], rows, cols), None, _BYTE_OFFSET, 8)


Reader = Callable[[np.ndarray, int, int], Q32Blocks]
READERS: dict[str, Reader] = {
    "Q4_0": read_q4_0,
    "Q4_1": read_q4_1,
    "Q5_0": read_q5_0,
    "Q5_1": read_q5_1,
    "Q8_0": read_q8_0,
}
