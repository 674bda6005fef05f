"""The server's secret key (`<cache_dir>/seal.key`) and what is derived from it: the tags that
seal reasoning (`api/seal.py`) and the `cache_salt` each API key's prompts carry to vLLM
replicas (`replicas/engine.py`).

One key, many uses: each use tags its messages with its own domain, so what one use shows (a
salt a replica sees) says nothing of another's tags. The key is 32 random bytes, mode 0600,
made at first use and read after, so a seal still opens and a salt is the same after a restart
(vLLM's prefix cache stays warm across ours). The file keeps its first use's name.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import threading
from pathlib import Path

from semantic.cache.disk.durable import fsync_dir, unlink_quietly, write_durably

KEY_FILE = "seal.key"
KEY_BYTES = 32


class ServerKey:
    """The server's key, `<folder>/seal.key`: read on first use, made then if absent (or not a
    key), whole or not at all. Lazy, so a server that never needs it writes nothing."""

    def __init__(self, folder: Path) -> None:
        self.path = folder / KEY_FILE
        self._secret: bytes | None = None
        self._lock = threading.Lock()  # requests render on worker threads

    def secret(self) -> bytes:
        with self._lock:
            if self._secret is None:
                self._secret = self._read() or self._make()
            return self._secret

    def tag(self, domain: bytes, message: bytes) -> bytes:
        """HMAC-SHA256 under the key of `message` in `domain` (a use's own fixed prefix, which
        no other use's prefix begins with)."""
        return hmac.new(self.secret(), domain + message, hashlib.sha256).digest()

    def _read(self) -> bytes | None:
        try:
            secret = self.path.read_bytes()
        except FileNotFoundError:
            return None
        os.chmod(self.path, 0o600)  # a key copied in with looser rights is kept to its owner
        return secret if len(secret) == KEY_BYTES else None

    def _make(self) -> bytes:
        """A new key, put in place only where there is none: the seals and the engine over
        vLLM each hold a `ServerKey`, and when both make one at once the first on disk is the
        key for both. A file that is no key is replaced."""
        secret = secrets.token_bytes(KEY_BYTES)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        made = self.path.with_name(f".{KEY_FILE}.{secrets.token_hex(6)}")
        write_durably(made, secret)  # mode 0600
        try:
            os.link(made, self.path)  # fails where a file is already
        except FileExistsError:
            first = self._read()
            if first is not None:
                return first
            os.replace(made, self.path)
        finally:
            unlink_quietly(made)
        fsync_dir(self.path.parent)
        return secret
