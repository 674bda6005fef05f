"""The git status each Claude Code session started with, so its later processes say it again.

Each `claude -p` process (a session's first turn, then each `--continue` or `--resume`) puts a
new snapshot of the repository in its system prompt: a `gitStatus:` section that reads "This
is the git status at the start of the conversation". The section comes before the history, so
once a turn changes a file, the next process's prompt parts from the cached one there and the
whole history is prefilled again (a recorded `--continue` turn parted at token 19,795 of 19,967
on Qwen2.5-Coder's tokenizer). The server keeps the section of the first request it sees of a
session and renders that one in the session's later requests, which then extend the cached
prompt and answer: the text is the status "at the start of the conversation", and an
interactive session, one process throughout, shows its model the same first snapshot.

Bounded and kept in memory only: the last `capacity` sessions used (4,096 by default), a
snapshot of at most `MAX_CHARS` each (a longer one, or one under a session id longer than
`MAX_SESSION_CHARS`, is rendered as sent and not kept), so at most ~35M characters in all;
Claude Code's snapshots are a few hundred to ~3K. One key's new sessions can push another's out
(that session then sets its snapshot again), never set one: entries are kept per API key owner.
After a restart (or once a session has left the memory), its next request's snapshot is the one
kept: that turn reads its history from the cache only if the status is still the one it was
cached with.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

MAX_CHARS = 8192
MAX_SESSION_CHARS = 256  # Claude Code's are uuids; the header's length is the client's to choose
CAPACITY = 4096


class GitSnapshots:
    """Per (owner, session): the first `gitStatus:` section seen. Holds at most `capacity`
    entries, each at most `MAX_CHARS` under a session id of at most `MAX_SESSION_CHARS`; the
    one used least recently leaves first. An entry, once set, is never replaced while kept."""

    def __init__(self, capacity: int = CAPACITY) -> None:
        self.capacity = capacity
        self._first: OrderedDict[tuple[str | None, str], str] = OrderedDict()
        self._lock = threading.Lock()  # cheap, and safe should a render thread ask

    def first(self, owner: str | None, session: str, status: str) -> str:
        """The snapshot `session` (of `owner`) started with; `status` (and kept as such) when
        this is the first one seen (or too long to keep)."""
        if len(status) > MAX_CHARS or len(session) > MAX_SESSION_CHARS:
            return status
        key = (owner, session)
        with self._lock:
            kept = self._first.get(key)
            if kept is None:
                self._first[key] = kept = status
                if len(self._first) > self.capacity:
                    self._first.popitem(last=False)
            self._first.move_to_end(key)
            return kept

    def peek(self, owner: str | None, session: str) -> str | None:
        """The snapshot kept for `session` (of `owner`), if any; keeps nothing."""
        with self._lock:
            return self._first.get((owner, session))

    def __len__(self) -> int:
        return len(self._first)
