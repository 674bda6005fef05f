"""One cache folder, one writer: an exclusive lock on the KV cache folder.

Two servers on one folder would delete each other's temporary files, evict each other's blocks
and roll back each other's manifests, so a server takes this lock before it loads its model and
holds it until it exits, and `semantic agents delete` takes it while it deletes. The lock is an
`flock` on `<folder>/server.lock`, which holds the holder's pid for the message the next one
gets. The kernel drops it when its holder exits, however it exits (kill -9 included), so no
stale lock is ever left to clean up; the file itself stays, and is never deleted (a process that
deleted it could race another that just opened it).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

from semantic.errors import CacheFolderBusy

LOCK_NAME = "server.lock"


class FolderLock:
    """A held lock on one folder; `release()` (or leaving the `with` block) lets it go."""

    def __init__(self, folder: Path, fd: int) -> None:
        self.folder = folder
        self._fd: int | None = fd

    @classmethod
    def acquire(cls, folder: Path) -> FolderLock:
        """Take the folder's lock at once, or raise `CacheFolderBusy` naming its holder."""
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(folder / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_pid(fd)
            os.close(fd)
            raise CacheFolderBusy(folder, holder) from None
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        return cls(folder, fd)

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the file drops the lock
            self._fd = None

    def __enter__(self) -> FolderLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _read_pid(fd: int) -> int | None:
    """The holder's pid, or None if it has not written it yet (it just took the lock)."""
    with contextlib.suppress(OSError, ValueError):
        return int(os.pread(fd, 32, 0).decode().strip())
    return None
