"""A block file's safetensors header, checked against the file's size before any of it is parsed
or any tensor is read.

The first 8 bytes of a safetensors file give its header's length, the header gives each
tensor's offsets into the data after it, and a reader that trusts either allocates what they
say: a length of 2**64 - 1 stops a start with OverflowError, 2**45 with MemoryError. So the
length is bounded (`MAX_HEADER_BYTES`: a block's header takes a few hundred bytes) and held to
the file's size before the header is read, and every tensor's bytes must lie within the file
before any is read. The start-up index reads only this much of each file; a read reads it from
the whole file's bytes.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, BinaryIO, TypeGuard

from semantic.cache.disk.durable import QuarantineReason, Rejected

MAX_HEADER_BYTES = 1 << 20


@dataclass(slots=True, frozen=True)
class TensorEntry:
    """One tensor as the header names it: its dtype, its shape, and where its bytes lie,
    `start` and `end` counted from `BlockHeader.data_start`."""

    dtype: str
    shape: tuple[int, ...]
    start: int
    end: int


@dataclass(slots=True, frozen=True)
class BlockHeader:
    """A header that passed its checks: every tensor's bytes lie within the file."""

    metadata: dict[str, str]
    tensors: dict[str, TensorEntry]
    data_start: int  # where the tensors' bytes begin in the file


def header_of(data: bytes) -> BlockHeader:
    """The header of a whole file held in `data`."""
    return _checked(data[:8], lambda length: data[8 : 8 + length], len(data))


def read_header(file: BinaryIO) -> BlockHeader:
    """The header of an open file, read from its start: no more than its size allows."""
    size = os.fstat(file.fileno()).st_size
    return _checked(file.read(8), file.read, size)


def _checked(prefix: bytes, read: Callable[[int], bytes], file_size: int) -> BlockHeader:
    if len(prefix) < 8:
        raise Rejected(QuarantineReason.TRUNCATED, f"{file_size} bytes")
    length = int.from_bytes(prefix, "little")
    if length > MAX_HEADER_BYTES:
        raise Rejected(QuarantineReason.CORRUPT, f"a header of {length} bytes")
    if 8 + length > file_size:
        raise Rejected(QuarantineReason.TRUNCATED, "header cut short")
    try:
        header = json.loads(read(length))
    except (ValueError, RecursionError) as exc:  # RecursionError: nested past Python's stack
        raise Rejected(QuarantineReason.CORRUPT, f"header: {exc}") from exc
    if not isinstance(header, dict):
        raise Rejected(QuarantineReason.CORRUPT, "the header is not a JSON object")
    metadata = header.pop("__metadata__", {})
    if not isinstance(metadata, dict) or not all(isinstance(x, str) for x in metadata.values()):
        raise Rejected(QuarantineReason.CORRUPT, "metadata is not strings")
    data_size = file_size - 8 - length
    tensors = {name: _entry(name, raw, data_size) for name, raw in header.items()}
    return BlockHeader(metadata, tensors, 8 + length)


def _entry(name: str, raw: Any, data_size: int) -> TensorEntry:
    """A tensor's entry, its offsets within the `data_size` bytes after the header."""
    if not isinstance(raw, dict) or not isinstance(raw.get("dtype"), str):
        raise Rejected(QuarantineReason.CORRUPT, f"tensor {name!r} has no dtype")
    shape, offsets = raw.get("shape"), raw.get("data_offsets")
    if not _counts(shape) or not _counts(offsets) or len(offsets) != 2:
        raise Rejected(QuarantineReason.CORRUPT, f"tensor {name!r}: shape or offsets")
    start, end = offsets
    if start > end:
        raise Rejected(QuarantineReason.CORRUPT, f"tensor {name!r} ends before it starts")
    if end > data_size:
        raise Rejected(QuarantineReason.TRUNCATED, "data cut short")
    return TensorEntry(raw["dtype"], tuple(shape), start, end)


def _counts(value: object) -> TypeGuard[list[int]]:
    """Whether `value` is a JSON list of non-negative integers (true and false are not)."""
    return isinstance(value, list) and all(
        isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in value
    )
