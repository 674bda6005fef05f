"""Conversations on disk, each stored once by its content: `conversations/<digest>.json` under a
model's cache folder, named by the manifests of the agents that hold it.

A fork names its parent's file rather than copying it, so ninety forks of an agent with an
8 MB system prompt keep one 8 MB file; a file goes once no manifest names it (`ConversationFiles`
counts the names), whichever agent was deleted first. A file is checked before it is used: its
size, then that its bytes are the digest it is named by, then every field's type.
"""

from __future__ import annotations

import logging
import re
import threading
from collections import Counter
from pathlib import Path

from semantic.cache.agents.conversation import Conversation, digest_of
from semantic.cache.disk.durable import (
    QuarantineReason,
    Rejected,
    fsync_dir,
    move_to_quarantine,
    read_bounded,
    remove_temp_files,
    unlink_quietly,
    write_durably,
)
from semantic.text import client_json

log = logging.getLogger(__name__)

DIGEST_PATTERN = re.compile(r"[0-9a-f]{32}")  # `digest_of`
# Far past any conversation a server keeps (`max_conversation_mb` of text takes at most a few
# times that in JSON), and small enough that reading one never runs out of memory.
MAX_CONVERSATION_FILE_BYTES = 1 << 30


def conversation_path(root_for_model: Path, digest: str) -> Path:
    if not DIGEST_PATTERN.fullmatch(digest):
        raise ValueError(f"{digest[:40]!r} is not a conversation digest")
    return root_for_model / "conversations" / f"{digest}.json"


def store_conversation(root_for_model: Path, conversation: Conversation) -> str:
    """Write the conversation's file unless it is there already; returns its digest (OSError
    when the write failed)."""
    digest = conversation.digest()
    path = conversation_path(root_for_model, digest)
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        write_durably(path, conversation.to_bytes())
    return digest


def delete_conversation(root_for_model: Path, digest: str) -> None:
    """Remove a conversation's file durably, if it is there."""
    path = conversation_path(root_for_model, digest)
    try:
        path.unlink()
    except FileNotFoundError:
        return
    fsync_dir(path.parent)


class ConversationReader:
    """Reads conversation files for one pass over the manifests, each file once: agents that
    name one digest get one `Conversation` between them, so a start-up holds it once."""

    def __init__(self, root_for_model: Path) -> None:
        self.root_for_model = root_for_model
        self._read: dict[str, Conversation] = {}

    def read(self, digest: str) -> Conversation:
        """The conversation stored under `digest`; Rejected (the manifest naming it is then
        quarantined) when it is missing or fails a check, a bad file moved to quarantine;
        OSError when it could not be read (the manifest is then skipped, not quarantined)."""
        if digest in self._read:
            return self._read[digest]
        path = conversation_path(self.root_for_model, digest)
        try:
            conversation = _checked(read_bounded(path, MAX_CONVERSATION_FILE_BYTES), digest)
        except FileNotFoundError as exc:
            raise Rejected(QuarantineReason.CORRUPT, f"conversation {digest} is missing") from exc
        except Rejected as rejected:
            move_to_quarantine(path, self.root_for_model / "quarantine", rejected.reason)
            log.warning("conversation file %s quarantined: %s", path.name, rejected)
            raise
        self._read[digest] = conversation
        return conversation


class ConversationFiles:
    """The conversation files of one model, for the server that owns the folder: how many
    manifests name each (`retain` before a manifest that names it is written, `release` once
    one no longer does), and the bytes they take (the disk budget counts them). A file no
    manifest names is removed. Thread-safe: manifests are written off the engine thread."""

    def __init__(self, root_for_model: Path) -> None:
        self.root_for_model = root_for_model
        self._users: Counter[str] = Counter()
        self._sizes: dict[str, int] = {}
        self._lock = threading.Lock()

    def count(self, digest: str) -> None:
        """At start-up: a manifest on disk names `digest`."""
        with self._lock:
            self._users[digest] += 1
            self._sizes[digest] = _size_of(conversation_path(self.root_for_model, digest))

    def remove_unnamed(self) -> None:
        """At start-up, after `count`: remove the files no manifest names (a crash between a
        conversation's write and its manifest's, or between a manifest's removal and its
        conversation's), and the temp files of writes a crash cut short."""
        folder = self.root_for_model / "conversations"
        if not folder.is_dir():
            return
        remove_temp_files(folder)
        for path in folder.glob("*.json"):
            if DIGEST_PATTERN.fullmatch(path.stem) and path.stem not in self._users:
                unlink_quietly(path)

    def retain(self, conversation: Conversation) -> str:
        """One more manifest is about to name this conversation: its file is written unless it
        is there; returns its digest. OSError when the write failed (and then nothing counts)."""
        digest = conversation.digest()
        with self._lock:
            self._users[digest] += 1  # first, so that a `release` meanwhile keeps the file
        try:
            store_conversation(self.root_for_model, conversation)
        except OSError:
            self.release(digest)
            raise
        with self._lock:
            self._sizes[digest] = _size_of(conversation_path(self.root_for_model, digest))
        return digest

    def release(self, digest: str) -> None:
        """One manifest no longer names `digest`; the last one's going removes the file."""
        with self._lock:
            self._users[digest] -= 1
            if self._users[digest] > 0:
                return
            del self._users[digest]
            self._sizes.pop(digest, None)
            try:
                delete_conversation(self.root_for_model, digest)
            except OSError as exc:  # left behind, it is removed at the next start
                log.warning("conversation file %s not removed: %s", digest, exc)

    def users(self, digest: str) -> int:
        with self._lock:
            return self._users[digest]

    def num_bytes(self) -> int:
        with self._lock:
            return sum(self._sizes.values())


def _checked(data: bytes, digest: str) -> Conversation:
    if digest_of(data) != digest:
        raise Rejected(QuarantineReason.CHECKSUM, "its bytes are not the digest it is named by")
    try:
        return Conversation.stored(client_json.loads(data), digest)
    except (ValueError, KeyError, TypeError, ArithmeticError) as exc:
        raise Rejected(QuarantineReason.CORRUPT, str(exc)) from exc


def _size_of(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0
