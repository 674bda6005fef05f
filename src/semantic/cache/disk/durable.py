"""Files that are whole or absent: atomic durable writes, fsync, temp-file cleanup, quarantine.

A crash at any point leaves a file under its final name complete, or not there at all; a file
that fails its checks when read is moved to a quarantine folder, with the reason in its name.
"""

from __future__ import annotations

import contextlib
import enum
import fcntl
import os
import re
import time
import uuid
from pathlib import Path

from semantic.errors import CacheCorrupt

TMP_SUFFIX = ".tmp"
HEX_HASH = re.compile(r"[0-9a-f]{16}")


def write_durably(path: Path, data: bytes) -> None:
    """Write `data` to `path` atomically: a temp file in the same folder, fsync, rename, fsync the
    folder. Readers see the old state or the whole new file, never part of it; on failure the
    temp file is removed and the OSError propagates."""
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:12]}{TMP_SUFFIX}")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            _write_all(fd, data)
            _fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        unlink_quietly(tmp)
        raise
    fsync_dir(path.parent)  # makes the rename itself durable


def fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def remove_temp_files(folder: Path) -> int:
    """Delete the temp files an interrupted write left in `folder`; returns how many."""
    if not folder.is_dir():
        return 0
    stray = [p for p in folder.iterdir() if p.name.endswith(TMP_SUFFIX)]
    for path in stray:
        unlink_quietly(path)
    return len(stray)


class QuarantineReason(enum.StrEnum):
    TRUNCATED = "truncated"  # shorter than its own header says
    CORRUPT = "corrupt"  # unparsable header or tensors, or a name that disagrees with content
    TOO_LARGE = "too_large"  # larger than any file of its kind: never read whole
    CHECKSUM = "checksum"  # parses, but the bytes changed since they were written
    OTHER_MODEL = "other_model"
    OTHER_SPEC = "other_spec"
    VERSION = "version"
    SHAPE = "shape"  # tensors missing or of the wrong shape or dtype for this spec


class Rejected(CacheCorrupt):
    """A file failed one check; carries the reason it is quarantined under."""

    def __init__(self, reason: QuarantineReason, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


def read_bounded(path: Path, limit: int) -> bytes:
    """The file's bytes, once its size says it may be what it should (Rejected past `limit`,
    read no further: a damaged or planted file can be any size)."""
    with path.open("rb") as file:
        size = os.fstat(file.fileno()).st_size
        if size > limit:
            raise Rejected(QuarantineReason.TOO_LARGE, f"{size} bytes")
        return file.read()


def move_to_quarantine(path: Path, quarantine_dir: Path, reason: str) -> bool:
    """Move a bad file aside (kept for inspection, never read again); False if it was gone."""
    target = quarantine_dir / f"{path.stem}.{reason}.{time.time_ns()}{path.suffix}"
    try:
        quarantine_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.replace(path, target)
    except FileNotFoundError:
        return False
    except OSError:
        unlink_quietly(path)  # cannot move it: deleting still keeps it from being loaded
    return True


def parse_hash(text: object) -> int:
    if not isinstance(text, str) or not HEX_HASH.fullmatch(text):
        raise ValueError(f"not a 16-hex-digit hash: {text!r}")
    return int(text, 16)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _fsync(fd: int) -> None:
    # On macOS fsync stops at the drive's cache; F_FULLFSYNC reaches stable storage.
    full_fsync = getattr(fcntl, "F_FULLFSYNC", None)
    if full_fsync is not None:
        with contextlib.suppress(OSError):
            fcntl.fcntl(fd, full_fsync)
            return
    os.fsync(fd)


def unlink_quietly(path: Path) -> None:
    with contextlib.suppress(OSError):
        path.unlink(missing_ok=True)
