"""Stored responses of the Responses API (`store: true`): one JSON file per response under
`<cache_dir>/responses/<owner>/`, written atomically, so `previous_response_id` still finds its
chain after a restart. A response belongs to the API key that made it (none without keys): it
lives in its key's folder, and another key neither reads, continues nor deletes it. They hold
clients' conversations: the folders are this user's alone (0700), the files too (0600).

A client's text is hostile, so stored responses must not fill the disk, and one key must not
push out another's: each owner keeps at most `max_responses`, `max_bytes` in all, its own oldest
going first; past `max_total_bytes` over every owner, the owner holding the most gives up its
oldest. The newest records are kept in memory too (`cache_bytes`), so a continuation reads
its chain from memory rather than every response of it from disk on each turn. Blocking file
I/O: the routes call it on worker threads.
"""

from __future__ import annotations

import json
import os
import re
import stat
import threading
from collections import OrderedDict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from semantic.cache.disk.durable import unlink_quietly, write_durably
from semantic.errors import InvalidRequest, NotFound

_ID = re.compile(r"resp_[0-9a-f]{32}")
_OWNER = re.compile(r"[0-9a-f]{32}")  # auth.owner_digest's form
_NO_OWNER = "anyone"  # the folder of a server without keys
MAX_CHAIN = 10_000  # responses followed back through previous_response_id
FORMAT = 1


@dataclass(slots=True)
class StoredResponse:
    """A response as answered (`response`), its input items (each with an id), the chat-template
    messages it adds to its chain (its input, then its output), the agent its chain's cache is
    kept as, and its owner (the owner digest of its API key, as agents have)."""

    response: dict[str, Any]
    input_items: list[dict[str, Any]]
    messages: list[dict[str, Any]]
    agent_id: str | None
    owner: str | None

    @property
    def id(self) -> str:
        return str(self.response["id"])

    @property
    def previous_id(self) -> str | None:
        previous = self.response.get("previous_response_id")
        return previous if isinstance(previous, str) else None


@dataclass(slots=True)
class _Holding:
    """One owner's stored responses: each file's size by id, oldest first. `bytes` is always
    the sum of `sizes`."""

    sizes: OrderedDict[str, int] = field(default_factory=OrderedDict)
    bytes: int = 0

    def add(self, response_id: str, size: int) -> None:
        self.bytes += size - self.sizes.pop(response_id, 0)
        self.sizes[response_id] = size

    def discard(self, response_id: str) -> None:
        self.bytes -= self.sizes.pop(response_id, 0)

    def oldest(self) -> str:
        return next(iter(self.sizes))


class ResponseStore:
    def __init__(
        self,
        root: Path,
        max_responses: int = 10_000,
        max_bytes: int = 1024 * 2**20,
        max_total_bytes: int = 4096 * 2**20,
        cache_bytes: int = 64 * 2**20,
    ) -> None:
        self.root = root
        self.max_responses = max_responses  # each owner's
        self.max_bytes = max_bytes  # each owner's
        self.max_total_bytes = max_total_bytes
        self._lock = threading.Lock()
        # Each owner's kept responses (read from the folders on first use).
        self._held: dict[str | None, _Holding] | None = None
        self._recent = _RecentRecords(cache_bytes)

    def save(self, record: StoredResponse) -> None:
        with self._lock:
            held = self._holdings()  # before this one's file is there: it is counted below
        folder = self._folder(record.owner)
        _private(self.root)
        _private(folder)
        data = json.dumps({"format": FORMAT, **asdict(record)}, ensure_ascii=False).encode()
        write_durably(folder / f"{record.id}.json", data)
        with self._lock:
            held.setdefault(record.owner, _Holding()).add(record.id, len(data))
            # As a load would read it back: the caller's objects may change after this.
            self._recent.put(_record(json.loads(data)), len(data))
            dropped = self._over_bounds(held, record.owner, record.id)
            for _, response_id in dropped:
                self._recent.discard(response_id)
        for owner, response_id in dropped:
            unlink_quietly(self._folder(owner) / f"{response_id}.json")

    def load(self, response_id: str, owner: str | None) -> StoredResponse:
        """The stored response, or NotFound (also for another key's, and for an id that is not
        one of ours: it never reaches a path)."""
        if not _ID.fullmatch(response_id):
            raise _not_found(response_id)
        with self._lock:
            cached = self._recent.get(response_id)
        if cached is not None:
            if cached.owner != owner:
                raise _not_found(response_id)
            return cached
        try:
            data = (self._folder(owner) / f"{response_id}.json").read_bytes()
            record = _record(json.loads(data))
        except (OSError, ValueError, KeyError, TypeError):
            raise _not_found(response_id) from None
        if record.owner != owner:
            raise _not_found(response_id)
        with self._lock:
            self._recent.put(record, len(data))
        return record

    def delete(self, response_id: str, owner: str | None) -> None:
        self.load(response_id, owner)
        unlink_quietly(self._folder(owner) / f"{response_id}.json")
        with self._lock:
            self._recent.discard(response_id)
            holding = self._holdings().get(owner)
            if holding is not None:
                holding.discard(response_id)

    def chain(self, last_id: str, owner: str | None) -> list[StoredResponse]:
        """The responses from the start of `last_id`'s chain to it, oldest first."""
        chain: list[StoredResponse] = []
        next_id: str | None = last_id
        while next_id is not None:
            if len(chain) >= MAX_CHAIN:
                raise InvalidRequest(
                    f"previous_response_id: the chain is longer than {MAX_CHAIN} responses",
                    param="previous_response_id",
                )
            chain.append(self.load(next_id, owner))
            next_id = chain[-1].previous_id
        return chain[::-1]

    def _over_bounds(
        self, held: dict[str | None, _Holding], saver: str | None, newest: str
    ) -> list[tuple[str | None, str]]:
        """Take the responses past the bounds out of `held`, oldest first: the saving owner's
        own past its quota, then the biggest holder's past the total (never `newest`)."""
        dropped: list[tuple[str | None, str]] = []
        own = held[saver]
        while len(own.sizes) > 1 and (
            len(own.sizes) > self.max_responses or own.bytes > self.max_bytes
        ):
            dropped.append((saver, own.oldest()))
            own.discard(own.oldest())
        while sum(holding.bytes for holding in held.values()) > self.max_total_bytes:
            owner, holding = max(held.items(), key=lambda item: item[1].bytes)
            if holding.oldest() == newest:
                break
            dropped.append((owner, holding.oldest()))
            holding.discard(dropped[-1][1])
        return dropped

    def _folder(self, owner: str | None) -> Path:
        if owner is None:
            return self.root / _NO_OWNER
        if not _OWNER.fullmatch(owner):
            raise ValueError(f"not an owner digest: {owner[:40]!r}")
        return self.root / owner

    def _holdings(self) -> dict[str | None, _Holding]:
        if self._held is None:
            _adopt_unfiled(self.root)
            self._held = {}
            folders = [f for f in self.root.iterdir() if f.is_dir()] if self.root.is_dir() else []
            for folder in folders:
                if folder.name == _NO_OWNER or _OWNER.fullmatch(folder.name):
                    owner = None if folder.name == _NO_OWNER else folder.name
                    self._held[owner] = _scanned(folder)
        return self._held


class _RecentRecords:
    """The records saved or loaded last, up to `max_bytes` of their files' sizes: a chain's
    continuation finds its earlier responses here. Callers hold the store's lock."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._records: OrderedDict[str, tuple[StoredResponse, int]] = OrderedDict()
        self._bytes = 0

    def get(self, response_id: str) -> StoredResponse | None:
        entry = self._records.get(response_id)
        if entry is None:
            return None
        self._records.move_to_end(response_id)
        return entry[0]

    def put(self, record: StoredResponse, size: int) -> None:
        self.discard(record.id)
        if size > self.max_bytes:
            return
        self._records[record.id] = (record, size)
        self._bytes += size
        while self._bytes > self.max_bytes:
            _, (_, dropped) = self._records.popitem(last=False)
            self._bytes -= dropped

    def discard(self, response_id: str) -> None:
        entry = self._records.pop(response_id, None)
        if entry is not None:
            self._bytes -= entry[1]


def _record(raw: dict[str, Any]) -> StoredResponse:
    return StoredResponse(
        raw["response"], raw["input_items"], raw["messages"], raw["agent_id"], raw["owner"]
    )


def _scanned(folder: Path) -> _Holding:
    """An owner's folder as a holding, oldest first by modified time."""
    found = [f for f in folder.glob("resp_*.json") if _ID.fullmatch(f.stem)]
    holding = _Holding()
    for (_, size), stem in sorted((_stat(f), f.stem) for f in found):
        holding.add(stem, size)
    return holding


def _adopt_unfiled(root: Path) -> None:
    """Move the responses an older version kept in `root` itself into their owners' folders
    (once: then there are none). One that cannot be read is reachable by no one: removed."""
    for path in root.glob("resp_*.json") if root.is_dir() else []:
        try:
            owner = json.loads(path.read_bytes())["owner"]
            folder = root / (_NO_OWNER if owner is None else owner)
            if owner is not None and not _OWNER.fullmatch(owner):
                raise ValueError(owner)
            _private(folder)
            os.replace(path, folder / path.name)
        except (OSError, ValueError, KeyError, TypeError):
            unlink_quietly(path)


def _private(folder: Path) -> None:
    """Make `folder` (mode 0700), or make it 0700: an older version made it 0755."""
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    if stat.S_IMODE(folder.stat().st_mode) != 0o700:
        os.chmod(folder, 0o700)


def _stat(path: Path) -> tuple[float, int]:
    """(modified time, size) of a stored response's file; a file gone meanwhile is (0, 0)."""
    try:
        stat = path.stat()
    except OSError:
        return 0.0, 0
    return stat.st_mtime, stat.st_size


def _not_found(response_id: str) -> NotFound:
    return NotFound(f"No response found with id {response_id[:80]!r}.")
