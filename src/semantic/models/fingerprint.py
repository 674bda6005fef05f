"""The fingerprint of a checkpoint's weights: what its KV cache is tagged with, so that a cache
is never read into weights other than those that wrote it (a fine-tune, another file of the same
shape, one served name kept while the model file changes).

It is taken at every load, so it reads little: each file's size and header (for GGUF the
metadata and the tensor table, for safetensors the tensor table), and a few windows of every
tensor's bytes (its start, middle and end). A fine-tune changes every element of each tensor it
trains, so any trained tensor changes the fingerprint. Hashing every byte would cost seconds per
gigabyte; this costs a few KiB per tensor, read from pages the load is about to read anyway.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

WINDOW = 4096  # bytes read at each sampled place of a tensor


@dataclass(slots=True, frozen=True)
class WeightsFile:
    """One file of a checkpoint: where its header ends and where each tensor's bytes lie
    (absolute offsets, end exclusive)."""

    path: Path
    header_end: int
    tensors: list[tuple[int, int]]


def fingerprint(files: Iterable[WeightsFile], extra: bytes = b"") -> str:
    """32 hex digits naming the weights in `files`, in order, and `extra` (a configuration file
    that shapes the computation, for formats that keep one beside the weights)."""
    digest = hashlib.blake2b(extra, digest_size=16)
    for file in files:
        digest.update(_file_digest(file))
    return digest.hexdigest()


def _file_digest(file: WeightsFile) -> bytes:
    digest = hashlib.blake2b(digest_size=16)
    with file.path.open("rb") as handle:
        digest.update(handle.seek(0, 2).to_bytes(8, "little"))  # the size
        handle.seek(0)
        digest.update(handle.read(file.header_end))
        for start, end in file.tensors:
            for offset in _windows(start, end):
                handle.seek(offset)
                digest.update(handle.read(min(WINDOW, end - offset)))
    return digest.digest()


def _windows(start: int, end: int) -> list[int]:
    """Where to read a tensor of bytes `start..end`: all of it when small, else three windows."""
    if end - start <= 3 * WINDOW:
        return list(range(start, end, WINDOW))
    middle = start + (end - start) // 2 - WINDOW // 2
    return [start, middle, end - WINDOW]
