"""Reading a GGUF file's layout: its metadata as Python values and where each tensor's bytes are.

The `gguf` package's reader builds a numpy view for every element of every metadata array, which
takes ~10 s for a 262K-token vocabulary (Gemma's); this reads the same format (GGUF v2/v3:
header, key-value metadata, tensor infos, aligned data) in a fraction of a second. Tensor bytes
stay memory-mapped; the `gguf` package still dequantizes them.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

_MAGIC = b"GGUF"
_STRING, _ARRAY = 8, 9
_LENGTH = struct.Struct("<Q")  # a string's length
# Scalar value types: (struct format, numpy dtype).
_SCALARS = {
    0: ("<B", np.uint8),
    1: ("<b", np.int8),
    2: ("<H", np.uint16),
    3: ("<h", np.int16),
    4: ("<I", np.uint32),
    5: ("<i", np.int32),
    6: ("<f", np.float32),
    7: ("<?", np.bool_),
    10: ("<Q", np.uint64),
    11: ("<q", np.int64),
    12: ("<d", np.float64),
}


@dataclass(slots=True, frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # GGUF order: innermost dimension first
    tensor_type: GGMLQuantizationType
    data: np.ndarray  # its bytes, uint8, memory-mapped
    offset: int  # where they start in the file


class GGUFLayout:
    """A GGUF file's metadata (`fields`: key → str, number, bool or list) and tensors, whose
    bytes start at `data_offset`."""

    def __init__(self, path: Path) -> None:
        self._data = np.memmap(path, dtype=np.uint8, mode="r")
        self._buffer = memoryview(self._data.data)
        self._at = 0
        if bytes(self._buffer[:4]) != _MAGIC:
            raise ValueError("not a GGUF file (bad magic)")
        self._at = 4
        version = self._scalar(4)
        if version not in (2, 3):
            raise ValueError(f"GGUF version {version} is not supported")
        tensor_count, field_count = self._scalar(10), self._scalar(10)
        self.fields: dict[str, Any] = {}
        for _ in range(field_count):
            key = self._string()
            self.fields[key] = self._value(self._scalar(4))
        infos = [self._tensor_info() for _ in range(tensor_count)]
        alignment = int(self.fields.get("general.alignment", 32))
        self.data_offset = -(-self._at // alignment) * alignment
        self.tensors = [self._tensor(self.data_offset, *info) for info in infos]

    def _scalar(self, kind: int) -> Any:
        fmt, _ = _SCALARS[kind]
        (value,) = struct.unpack_from(fmt, self._buffer, self._at)
        self._at += struct.calcsize(fmt)
        return value

    def _string(self) -> str:
        length = self._scalar(10)
        text = bytes(self._buffer[self._at : self._at + length]).decode("utf-8", errors="replace")
        self._at += length
        return text

    def _strings(self, count: int) -> list[str]:
        """`count` strings in a row: a vocabulary's ~50K-250K, read in one tight loop (a call
        per string costs a tokenizer's load ~0.2 s)."""
        buffer, at, unpack = self._buffer, self._at, _LENGTH.unpack_from
        texts = []
        for _ in range(count):
            (length,) = unpack(buffer, at)
            at += 8
            texts.append(str(buffer[at : at + length], "utf-8", "replace"))
            at += length
        self._at = at
        return texts

    def _value(self, kind: int) -> Any:
        if kind == _STRING:
            return self._string()
        if kind != _ARRAY:
            return self._scalar(kind)
        item_kind, count = self._scalar(4), self._scalar(10)
        if item_kind == _STRING:
            return self._strings(count)
        if item_kind == _ARRAY:
            return [self._value(_ARRAY) for _ in range(count)]
        dtype = np.dtype(_SCALARS[item_kind][1]).newbyteorder("<")
        end = self._at + count * dtype.itemsize
        values = np.frombuffer(self._buffer[self._at : end], dtype=dtype).tolist()
        self._at = end
        return values

    def _tensor_info(self) -> tuple[str, tuple[int, ...], int, int]:
        name = self._string()
        dims = tuple(int(self._scalar(10)) for _ in range(self._scalar(4)))
        return name, dims, self._scalar(4), self._scalar(10)

    def _tensor(
        self, start: int, name: str, dims: tuple[int, ...], kind: int, offset: int
    ) -> TensorInfo:
        tensor_type = GGMLQuantizationType(kind)
        block, block_bytes = GGML_QUANT_SIZES[tensor_type]
        count = int(np.prod(dims, dtype=np.int64))
        begin = start + offset
        data = self._data[begin : begin + count // block * block_bytes]
        return TensorInfo(name, dims, tensor_type, data, begin)
