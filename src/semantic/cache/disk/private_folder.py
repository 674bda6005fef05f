"""Private folders: the folders the server loads files from at start-up (the KV cache, the CPU
kernels' build, prepared weights) are this user's, and no one else may write them.

A file is as trustworthy as the folders it lies in: another user who can write the KV cache
folder can plant blocks and manifests that a start reads, and one who can write the kernels'
build folder can plant the shared library that a start loads into this process. So each folder
from a cache's top down to the one a file lies in must belong to this user and be writable by
neither its group nor others. The server creates a missing folder with mode 0700. An existing
one that fails is refused with the command that fixes it, never repaired behind the user's back:
a folder others could write may already hold their files, and a `chmod` would not take them
out. The one exception is an empty folder of this user's, which holds nothing planted: it is
made 0700 and used (a folder made for the cache by `mkdir` under a loose umask).
"""

from __future__ import annotations

import contextlib
import logging
import os
import pwd
import stat
from pathlib import Path

from semantic.errors import FolderNotPrivate

log = logging.getLogger(__name__)

MODE = 0o700
_OTHERS_WRITE = stat.S_IWGRP | stat.S_IWOTH


def private_folder(folder: Path, top: Path, what: str) -> Path:
    """`folder`, after making each folder from `top` down to it that is missing (mode 0700)
    and checking each (`check_private`, which names a refused one as `what`). `folder` is `top`
    or lies under it; folders above `top` are made where missing but not checked."""
    parts = folder.relative_to(top).parts
    for path in [top, *(top.joinpath(*parts[: n + 1]) for n in range(len(parts)))]:
        _make(path)
        check_private(path, what)
    return folder


def check_private(path: Path, what: str) -> None:
    """FolderNotPrivate unless `path` (a folder, or a file about to be loaded) belongs to this
    user and neither its group nor others may write it; an empty folder of this user's that
    others may write is made 0700 first (nothing in it can have been planted)."""
    info = os.stat(path)
    me = os.geteuid()
    if info.st_uid != me:
        raise FolderNotPrivate(
            path,
            f"refusing {what} {path}: it belongs to {_user(info.st_uid)}, not to "
            f"{_user(me)}, who runs the server, so what it holds may be another user's. Use a "
            f"folder of your own, or `chown -R {_user_name(me)} {path}` if it is yours.",
        )
    loose = info.st_mode & _OTHERS_WRITE
    if loose and not (stat.S_ISDIR(info.st_mode) and _tightened_if_empty(path, info.st_mode)):
        raise FolderNotPrivate(
            path,
            f"refusing {what} {path}: {_who(loose)} may write it (mode "
            f"{stat.S_IMODE(info.st_mode):o}), so another user could put files there that the "
            f"server loads. Check what it holds, then run `chmod 700 {path}`, or use another.",
        )


def _make(folder: Path) -> None:
    """Make `folder` and any missing folder above it, each with mode 0700."""
    missing = []
    while not folder.exists() and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    for path in reversed(missing):
        with contextlib.suppress(FileExistsError):  # made meanwhile: checked like any other
            os.mkdir(path, MODE)


def _tightened_if_empty(folder: Path, mode: int) -> bool:
    """Whether `folder`, of this user's and writable by others, held nothing once no one else
    could write it, and is now 0700. Emptiness is read after the chmod, so nothing can land
    between the look and the change; one that holds files gets its mode back."""
    os.chmod(folder, MODE)
    with os.scandir(folder) as entries:
        empty = next(entries, None) is None
    if not empty:
        os.chmod(folder, stat.S_IMODE(mode))
        return False
    log.warning("%s was writable by others and empty: made private (mode 700)", folder)
    return True


def _who(bits: int) -> str:
    if bits == _OTHERS_WRITE:
        return "its group and others"
    return "its group" if bits & stat.S_IWGRP else "others"


def _user(uid: int) -> str:
    return f"user {_user_name(uid)} (uid {uid})"


def _user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)
