"""What can fail before the model loads, checked before it loads.

`semantic serve` checks here, in seconds, what would otherwise fail after a load of seconds to
minutes: torch is installed, the bind is allowed, the model is there, the cache folder can be
created, is this user's alone, can be written and locked, and the port is free (it is bound
here, and the socket handed to the server). Each failure is a SemanticError of one sentence that
says what to do.
"""

from __future__ import annotations

import contextlib
import errno
import importlib.util
import socket
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass

from semantic.backends import default_backend
from semantic.cache.disk.folder_lock import FolderLock
from semantic.cache.disk.private_folder import private_folder
from semantic.cache.disk.tier import cache_root
from semantic.errors import SemanticError
from semantic.models.registry import ModelRegistry, ModelSource
from semantic.settings.settings import Settings

_KEY_FLAGS = "--api-key, SEMANTIC_API_KEY, --api-key-file or --admin-api-key"


@dataclass(slots=True, frozen=True)
class Checked:
    """What the checks found and hold for the server: the model to load, and the listening
    socket. The cache folder's lock is held until the `checked` block ends."""

    registry: ModelRegistry
    source: ModelSource
    listener: socket.socket

    @property
    def url(self) -> str:
        """Where the server answers: the bound address, its real port (for `--port 0` too)."""
        host, port = self.listener.getsockname()[:2]
        return f"http://{f'[{host}]' if ':' in host else host}:{port}"


# backend → how to install what its extra holds. Not `pip install 'semantic[torch]'`: semantic
# is not on PyPI, and that would fetch whatever package goes by the name there.
_BACKEND_INSTALLS = {
    "torch": "pip install torch ninja (or `make install` in a clone)",
    "mlx": "pip install mlx (on Linux, pip install 'mlx[cpu]')",
}


@contextlib.contextmanager
def checked(settings: Settings) -> Iterator[Checked]:
    """Run every check; inside the block the cache folder is locked and the port bound."""
    check_backend(settings)
    check_bind(settings)
    registry = ModelRegistry.from_settings(settings)
    source = registry.resolve(settings.model)
    with locked_cache_folder(settings), listening(settings) as listener:
        yield Checked(registry, source, listener)


def check_backend(settings: Settings) -> None:
    """The backend's library is installed: without it the message names the install that
    brings it."""
    backend = default_backend() if settings.backend == "auto" else settings.backend
    if backend in _BACKEND_INSTALLS and importlib.util.find_spec(backend) is None:
        raise SemanticError(
            f"{backend} is not installed (semantic's {backend} extra): {_BACKEND_INSTALLS[backend]}"
        )


def check_bind(settings: Settings) -> None:
    """Loopback by default: serving other machines takes `--allow-remote` and an API key, so a
    server is never reachable from the network without a key by accident."""
    if settings.is_loopback:
        return
    if not settings.allow_remote:
        raise SemanticError(
            f"refusing to bind {settings.host!r}: it is not a loopback address; serving other "
            f"machines needs --allow-remote and an API key ({_KEY_FLAGS})"
        )
    if not settings.any_api_keys:
        raise SemanticError(
            f"refusing to bind {settings.host!r} without an API key: set one with {_KEY_FLAGS}"
        )


@contextlib.contextmanager
def locked_cache_folder(settings: Settings) -> Iterator[FolderLock]:
    """The KV cache folder, created (mode 0700), this user's alone, writable and locked: one
    server per folder, refused here so that a second one fails at once; held until the caches
    are persisted at exit. One that others may write is refused (FolderNotPrivate says how to
    fix it): the files in it are loaded at start-up."""
    folder = cache_root(settings.cache_dir)
    try:
        private_folder(folder, settings.cache_dir, "the cache folder")
        lock = FolderLock.acquire(folder)  # CacheFolderBusy names the holder and what to do
    except OSError as exc:
        raise _unusable(folder, exc) from None
    with lock:
        try:
            with tempfile.TemporaryFile(dir=folder):
                pass
        except OSError as exc:
            raise _unusable(folder, exc) from None
        yield lock


def _unusable(folder: object, exc: OSError) -> SemanticError:
    return SemanticError(
        f"cannot use {folder} as the cache folder ({exc.strerror or exc}): choose another "
        "with --cache-dir or SEMANTIC_CACHE_DIR, or make it a folder this user can write"
    )


@contextlib.contextmanager
def listening(settings: Settings) -> Iterator[socket.socket]:
    """A socket bound to the host and port and listening, for the server to take over."""
    host, port = settings.host, settings.port
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        bound = socket.create_server((host, port), family=family, backlog=2048)
        # The same socket, said to be TCP: asyncio turns Nagle's algorithm off (TCP_NODELAY)
        # only on connections accepted from a socket whose protocol is IPPROTO_TCP, and
        # `create_server` leaves it 0. With Nagle on, a response's body waits for the ACK of its
        # head, which the client delays: 40 ms added to every request.
        listener = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP, bound.detach())
    except OSError as exc:
        raise _cannot_listen(host, port, exc) from None
    with listener:
        yield listener


def _cannot_listen(host: str, port: int, exc: OSError) -> SemanticError:
    if exc.errno == errno.EADDRINUSE:
        return SemanticError(
            f"port {port} on {host} is already in use (another server, or a semantic started "
            "earlier): stop it, or choose another port with --port or SEMANTIC_PORT"
        )
    if exc.errno == errno.EACCES:
        return SemanticError(
            f"not allowed to listen on port {port}: ports below 1024 need privileges; choose "
            "another with --port or SEMANTIC_PORT"
        )
    return SemanticError(
        f"cannot listen on {host}:{port} ({exc.strerror or exc}): is {host!r} an address of "
        "this machine? Choose another with --host or SEMANTIC_HOST"
    )
