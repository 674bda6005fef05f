"""Stored responses of the Responses API (`store: true`): one JSON file per response under
`<cache_dir>/responses/`, written atomically, so `previous_response_id` still finds its chain
after a restart. A response belongs to the API key that made it (none without keys): another
key neither reads, continues nor deletes it. The oldest go once more than `max_responses`, or
more than `max_bytes` in all, are kept (a client's text is hostile: stored responses must not
fill the disk). Blocking file I/O: the routes call it on worker threads.
"""

from __future__ import annotations

import json
import re
import threading
from collections import OrderedDict
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from semantic.cache.durable import unlink_quietly, write_durably
from semantic.errors import InvalidRequest, NotFound

_ID = re.compile(r"resp_[0-9a-f]{32}")
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


class ResponseStore:
    def __init__(
        self, root: Path, max_responses: int = 10_000, max_bytes: int = 1024 * 2**20
    ) -> None:
        self.root = root
        self.max_responses = max_responses
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        # Each kept response's file size by id, oldest first (read from the folder on first use).
        self._kept: OrderedDict[str, int] | None = None
        self._bytes = 0

    def save(self, record: StoredResponse) -> None:
        with self._lock:
            kept = self._known()  # before this one's file is there: it is counted below
        self.root.mkdir(parents=True, exist_ok=True)
        data = json.dumps({"format": FORMAT, **asdict(record)}, ensure_ascii=False).encode()
        write_durably(self._path(record.id), data)
        dropped = []
        with self._lock:
            kept[record.id] = len(data)
            self._bytes += len(data)
            while len(kept) > 1 and (
                len(kept) > self.max_responses or self._bytes > self.max_bytes
            ):
                oldest, size = kept.popitem(last=False)
                self._bytes -= size
                dropped.append(oldest)
        for response_id in dropped:
            unlink_quietly(self._path(response_id))

    def load(self, response_id: str, owner: str | None) -> StoredResponse:
        """The stored response, or NotFound (also for another key's, and for an id that is not
        one of ours: it never reaches a path)."""
        if not _ID.fullmatch(response_id):
            raise _not_found(response_id)
        try:
            raw = json.loads(self._path(response_id).read_bytes())
            record = StoredResponse(
                raw["response"], raw["input_items"], raw["messages"], raw["agent_id"], raw["owner"]
            )
        except (OSError, ValueError, KeyError, TypeError):
            raise _not_found(response_id) from None
        if record.owner != owner:
            raise _not_found(response_id)
        return record

    def delete(self, response_id: str, owner: str | None) -> None:
        self.load(response_id, owner)
        unlink_quietly(self._path(response_id))
        with self._lock:
            self._bytes -= self._known().pop(response_id, 0)

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

    def _path(self, response_id: str) -> Path:
        return self.root / f"{response_id}.json"

    def _known(self) -> OrderedDict[str, int]:
        if self._kept is None:
            found = self.root.glob("resp_*.json") if self.root.is_dir() else []
            stats = sorted((_stat(f), f.stem) for f in found if _ID.fullmatch(f.stem))
            self._kept = OrderedDict((stem, size) for (_, size), stem in stats)
            self._bytes = sum(self._kept.values())
        return self._kept


def _stat(path: Path) -> tuple[float, int]:
    """(modified time, size) of a stored response's file; a file gone meanwhile is (0, 0)."""
    try:
        stat = path.stat()
    except OSError:
        return 0.0, 0
    return stat.st_mtime, stat.st_size


def _not_found(response_id: str) -> NotFound:
    return NotFound(f"No response found with id {response_id[:80]!r}.")
