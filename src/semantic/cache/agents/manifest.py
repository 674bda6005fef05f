"""Agent manifests: which blocks make up an agent's cache on disk, which stored conversation the
direct agent API keeps for it, and whose it is; one JSON file per agent, under
`agents/<owner>/<agent id>.<digest>.json` (`ManifestFiles` keeps them for a running server).
The conversation itself lies in a file of its own, by its digest
(`cache/agents/conversation_files.py`), which forks name too: a manifest stays a few hundred bytes
however long the conversation.

A manifest is checked before it is used: its size before it is read (`MAX_MANIFEST_BYTES`), then
every field's type and range; one that fails is moved to `quarantine/` and named in the log, and
the server starts without that agent.

File names are unique per agent whatever the filesystem: the owner's folder is lower-case hex
(`none` for agents without an owner), and the digest of the exact id tells `Alice` from `alice`
where the filesystem ignores case (macOS), while the API keeps ids case-sensitive.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from semantic.cache.agents.conversation import Conversation
from semantic.cache.agents.conversation_files import (
    DIGEST_PATTERN,
    ConversationFiles,
    ConversationReader,
    store_conversation,
)
from semantic.cache.disk.durable import (
    QuarantineReason,
    Rejected,
    fsync_dir,
    move_to_quarantine,
    parse_hash,
    read_bounded,
    unlink_quietly,
    write_durably,
)
from semantic.core import AgentKey, is_valid_agent_id
from semantic.errors import InvalidRequest
from semantic.text import client_json

log = logging.getLogger(__name__)

# 4 names the conversation by its file's digest (3 and 2 hold it inline); 3 added `owner` and the
# per-owner folders (older files lie at `agents/<agent id>.json` and are read as owned by no
# one); 2 added `conversation` (a version-1 file has none). `found_blocks` came without a new
# version: a file without it found none, and a server that does not know it reads the rest.
MANIFEST_FORMAT_VERSION = 4
_READABLE_VERSIONS = (1, 2, 3, 4)
# Far past any manifest a server writes (an older format's inline conversation at
# `max_conversation_mb` takes at most a few times its text in JSON), and small enough that
# reading one never runs out of memory.
MAX_MANIFEST_BYTES = 1 << 30
OWNER_PATTERN = re.compile(r"[0-9a-f]{32}")  # a digest of an API key (`api/auth.py`)
UNOWNED = "none"  # the folder of agents without an owner
_T = TypeVar("_T")


@dataclass(slots=True, frozen=True)
class AgentManifest:
    """An agent's cache on disk: its full blocks' hashes in order and its partial tail block.

    It only names blocks, which are shared and content-addressed, so deleting an agent removes
    its manifest, never blocks that other agents may share. In JSON, hashes are 16-hex-digit
    strings like the file names, since JSON numbers above 2**53 lose precision in many readers.

    `conversation` is the dialogue the direct agent API keeps (None for an agent that only
    chat requests named). On disk the manifest names it by digest, its file written before the
    manifest, so an agent, its cache and its history still change together, each change one
    atomic rename of the manifest.
    """

    agent_id: str
    model_tag: str
    block_hashes: list[int]
    tail_hash: int | None
    num_tokens: int
    pinned: bool = False
    conversation: Conversation | None = None
    updated_at: float = field(default_factory=time.time)
    owner: str | None = None  # `AgentKey.owner`
    found_blocks: int = 0  # `Agent.found_blocks` (absent in older files: it found none)
    format_version: int = MANIFEST_FORMAT_VERSION

    @property
    def key(self) -> AgentKey:
        return AgentKey(self.agent_id, self.owner)

    @property
    def hashes(self) -> list[int]:
        """Every block it names: the full blocks' hashes in order, then the tail's if any."""
        return [*self.block_hashes, *([self.tail_hash] if self.tail_hash is not None else [])]

    @property
    def computed(self) -> list[int]:
        """The blocks the agent computed itself (`Agent.computed`)."""
        return self.hashes[self.found_blocks :]


class ManifestFiles:
    """The manifests of one model's agents and the conversation files they name, for the server
    that owns the folder: written and deleted through here, so that the bytes they take are
    known (the disk budget counts them) and a conversation file lasts as long as a manifest
    names it. Thread-safe: manifests are written off the engine thread, and the disk writer
    reads the total."""

    def __init__(self, model_root: Path) -> None:
        self.model_root = model_root
        self.conversations = ConversationFiles(model_root)
        self._sizes: dict[AgentKey, int] = {}
        self._named: dict[AgentKey, str] = {}  # the conversation digest each manifest names
        self._total = 0  # sum of `_sizes`: read at every block write, so kept, not summed
        self._lock = threading.Lock()

    def load_all(self) -> list[AgentManifest]:
        """Every valid manifest (bad ones are quarantined), files of older formats moved to
        their names of today on the way, and conversation files no manifest names removed."""
        manifests = list_manifests(self.model_root)
        for manifest in manifests:
            path = manifest_path(self.model_root, manifest.key)
            legacy = _legacy_path(self.model_root, manifest.agent_id)
            if manifest.format_version < MANIFEST_FORMAT_VERSION:
                self._upgrade(manifest, legacy)
            elif manifest.owner is None and legacy.exists() and path.is_file():
                unlink_quietly(legacy)  # an upgrade cut short by a crash: the new file wins
            self._count(manifest.key, max(_size_of(path), _size_of(legacy)))
            if manifest.conversation is not None:
                self._named[manifest.key] = manifest.conversation.digest()
                self.conversations.count(manifest.conversation.digest())
        self.conversations.remove_unnamed()
        return manifests

    def save(self, manifest: AgentManifest) -> None:
        """Write it atomically and durably, its conversation's file first unless another
        manifest names it already; OSError when that failed (the old files stay)."""
        kept = manifest.conversation
        digest = None if kept is None else self.conversations.retain(kept)
        try:
            size = _write_manifest(self.model_root, manifest, digest)
        except OSError:
            if digest is not None:
                self.conversations.release(digest)
            raise
        self._count(manifest.key, size)
        self._name(manifest.key, digest)

    def delete(self, key: AgentKey) -> bool:
        """Remove it durably, and its conversation's file if no other manifest names it;
        OSError when that failed (and then it may still be there)."""
        try:
            return delete_manifest(self.model_root, key)
        finally:
            if not has_manifest(self.model_root, key):
                self._count(key, 0)
                self._name(key, None)

    def num_bytes(self) -> int:
        """What the manifests and the conversation files take, each file counted once."""
        with self._lock:
            manifests = self._total
        return manifests + self.conversations.num_bytes()

    def _name(self, key: AgentKey, digest: str | None) -> None:
        """The manifest of `key` now names `digest` (None: none, or it is gone)."""
        with self._lock:
            before = self._named.pop(key, None)
            if digest is not None:
                self._named[key] = digest
        if before is not None:
            self.conversations.release(before)

    def _count(self, key: AgentKey, size: int) -> None:
        with self._lock:
            self._total += size - self._sizes.pop(key, 0)
            if size:
                self._sizes[key] = size

    def _upgrade(self, manifest: AgentManifest, legacy: Path) -> None:
        """Write an older file under today's name and format, then remove it; if that fails,
        the old file serves (it is read as it is, and removed with the agent)."""
        try:
            save_manifest(self.model_root, manifest)
        except OSError as exc:
            log.warning("agent manifest of %s not upgraded: %s", manifest.agent_id, exc)
            return
        unlink_quietly(legacy)
        fsync_dir(legacy.parent)


def save_manifest(root_for_model: Path, manifest: AgentManifest) -> int:
    """Write the agent's manifest atomically and durably, and its conversation's file unless it
    is there (InvalidRequest for a bad id); returns the manifest's size in bytes. Outside a
    running server (its `ManifestFiles` counts which manifests name which conversation)."""
    kept = manifest.conversation
    digest = None if kept is None else store_conversation(root_for_model, kept)
    return _write_manifest(root_for_model, manifest, digest)


def _write_manifest(root_for_model: Path, manifest: AgentManifest, digest: str | None) -> int:
    """Write the manifest, naming the conversation file of `digest`; returns its size."""
    if manifest.model_tag != root_for_model.name:
        raise ValueError(f"manifest of {manifest.model_tag!r} under {root_for_model}")
    path = manifest_path(root_for_model, manifest.key)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    raw = {
        "format_version": MANIFEST_FORMAT_VERSION,
        "agent_id": manifest.agent_id,
        "owner": manifest.owner,
        "model_tag": manifest.model_tag,
        "block_hashes": [f"{h:016x}" for h in manifest.block_hashes],
        "tail_hash": None if manifest.tail_hash is None else f"{manifest.tail_hash:016x}",
        "num_tokens": manifest.num_tokens,
        "found_blocks": manifest.found_blocks,
        "pinned": manifest.pinned,
        "conversation": digest,
        "updated_at": manifest.updated_at,
    }
    data = json.dumps(raw, indent=1).encode()
    write_durably(path, data)
    return len(data)


def load_manifest(root_for_model: Path, key: AgentKey) -> AgentManifest | None:
    """The agent's manifest; None when absent or bad (a bad one is moved to `quarantine/`)."""
    reader = ConversationReader(root_for_model)
    return _read(root_for_model, manifest_path(root_for_model, key), key, reader)


def list_manifests(root_for_model: Path) -> list[AgentManifest]:
    """Every valid manifest of this model, by owner and agent id, older formats' files included
    where they lie; bad ones are quarantined on the way. Manifests that name one conversation
    file share one `Conversation`."""
    folder = root_for_model / "agents"
    if not folder.is_dir():
        return []
    found = []
    reader = ConversationReader(root_for_model)
    for path in sorted(folder.glob("*/*.json")):
        owned = OWNER_PATTERN.fullmatch(path.parent.name) or path.parent.name == UNOWNED
        if owned and path.is_file():  # not a pipe, which would block the read
            found.append(_read(root_for_model, path, None, reader))
    taken = {m.key for m in found if m is not None}
    for path in sorted(folder.glob("*.json")):  # format 2 and older: unowned, named by the id
        key = AgentKey(path.stem)
        if is_valid_agent_id(path.stem) and key not in taken and path.is_file():
            found.append(_read(root_for_model, path, key, reader))
    return [m for m in found if m is not None]


def delete_manifest(root_for_model: Path, key: AgentKey) -> bool:
    """Remove an agent's manifest durably (a deleted agent must not return after a crash),
    and the file an older format named it by, if it is still there."""
    removed = False
    for path in _paths_of(root_for_model, key):
        try:
            path.unlink()
        except FileNotFoundError:
            continue
        fsync_dir(path.parent)
        removed = True
    return removed


def has_manifest(root_for_model: Path, key: AgentKey) -> bool:
    """Whether the cache of the model at `root_for_model` has a manifest of this agent."""
    return any(path.is_file() for path in _paths_of(root_for_model, key))


def manifest_path(root_for_model: Path, key: AgentKey) -> Path:
    """Where an agent's manifest lives: unique per agent even where case is ignored."""
    if not is_valid_agent_id(key.agent_id):
        raise InvalidRequest(f"invalid agent id {key.agent_id[:40]!r}", param="agent_id")
    if key.owner is not None and not OWNER_PATTERN.fullmatch(key.owner):
        raise ValueError(f"owner {key.owner[:40]!r} is not a key digest")
    digest = hashlib.blake2b(key.agent_id.encode(), digest_size=4).hexdigest()
    return root_for_model / "agents" / (key.owner or UNOWNED) / f"{key.agent_id}.{digest}.json"


def _paths_of(root_for_model: Path, key: AgentKey) -> list[Path]:
    """Where the agent's manifest may lie: its own name, and for an agent of no owner, the
    name an older format gave it."""
    paths = [manifest_path(root_for_model, key)]
    if key.owner is None:
        paths.append(_legacy_path(root_for_model, key.agent_id))
    return paths


def _legacy_path(root_for_model: Path, agent_id: str) -> Path:
    return root_for_model / "agents" / f"{agent_id}.json"


def _read(
    root_for_model: Path, path: Path, key: AgentKey | None, reader: ConversationReader
) -> AgentManifest | None:
    """The manifest at `path`, which must be `key`'s (any agent's when None) and sit where its
    own key puts it (or at the older name for its id), with the conversation it names."""
    try:
        manifest = _manifest_from_json(read_bounded(path, MAX_MANIFEST_BYTES), reader)
        if manifest.model_tag != root_for_model.name or key not in (None, manifest.key):
            raise Rejected(QuarantineReason.OTHER_MODEL, "written for another model or agent")
        if path not in _paths_of(root_for_model, manifest.key):
            raise Rejected(QuarantineReason.CORRUPT, "its name is not its agent's")
    except OSError as exc:
        if not isinstance(exc, FileNotFoundError):
            log.warning("agent manifest %s unreadable: %s", path.name, exc)
        return None
    except Rejected as rejected:
        move_to_quarantine(path, root_for_model / "quarantine", rejected.reason)
        log.warning("agent manifest %s quarantined: %s", path.name, rejected)
        return None
    return manifest


def _size_of(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _manifest_from_json(data: bytes, reader: ConversationReader) -> AgentManifest:
    try:
        raw = client_json.loads(data)  # mended: an older server stored lone surrogates as sent
        if not isinstance(raw, dict):
            raise TypeError("not a JSON object")
        version = raw.get("format_version")
        if version not in _READABLE_VERSIONS or isinstance(version, bool):
            raise Rejected(QuarantineReason.VERSION, f"format {version!r}")
        tail, conversation, owner = raw["tail_hash"], raw.get("conversation"), raw.get("owner")
        if owner is not None and not (isinstance(owner, str) and OWNER_PATTERN.fullmatch(owner)):
            raise ValueError("owner is not a key digest")
        agent_id = _typed(raw, "agent_id", str)
        if not is_valid_agent_id(agent_id):
            raise ValueError("agent_id is not a valid agent id")
        return AgentManifest(
            agent_id=agent_id,
            model_tag=_typed(raw, "model_tag", str),
            block_hashes=[parse_hash(h) for h in _typed(raw, "block_hashes", list)],
            tail_hash=None if tail is None else parse_hash(tail),
            num_tokens=_count(raw, "num_tokens"),
            found_blocks=_found_blocks(raw),
            pinned=_typed(raw, "pinned", bool) if "pinned" in raw else False,
            conversation=_conversation(conversation, reader),
            owner=owner,
            updated_at=_time(raw, "updated_at"),
            format_version=version,
        )
    except (ValueError, KeyError, TypeError, ArithmeticError) as exc:  # 1e400 overflows float()
        raise Rejected(QuarantineReason.CORRUPT, str(exc)) from exc


def _conversation(raw: object, reader: ConversationReader) -> Conversation | None:
    """The conversation a manifest names by digest, or holds inline (formats 2 and 3)."""
    if raw is None:
        return None
    if isinstance(raw, str):
        if not DIGEST_PATTERN.fullmatch(raw):
            raise ValueError("conversation is not a digest")
        return reader.read(raw)
    return Conversation.from_json(raw)


def _found_blocks(raw: dict[str, object]) -> int:
    found = _count(raw, "found_blocks") if "found_blocks" in raw else 0
    if found > len(_typed(raw, "block_hashes", list)):
        raise ValueError("found_blocks is past block_hashes")
    return found


def _typed(raw: dict[str, object], key: str, kind: type[_T] | tuple[type[_T], ...]) -> _T:
    value = raw[key]
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise TypeError(f"{key} is not a {kind}")
    return value


def _count(raw: dict[str, object], key: str) -> int:
    value = _typed(raw, key, int)
    if value < 0:
        raise ValueError(f"{key} is negative")
    return value


def _time(raw: dict[str, object], key: str) -> float:
    value = float(_typed(raw, key, (int, float)))
    if not math.isfinite(value):
        raise ValueError(f"{key} is not a finite number")
    return value
