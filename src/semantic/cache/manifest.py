"""Agent manifests: which blocks make up an agent's cache on disk, and the conversation the
direct agent API keeps for it; one JSON file per agent."""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from semantic.cache.conversation import Conversation
from semantic.cache.disk import QuarantineReason, Rejected
from semantic.cache.durable import fsync_dir, move_to_quarantine, parse_hash, write_durably
from semantic.core import is_valid_agent_id
from semantic.errors import InvalidRequest

log = logging.getLogger(__name__)

# 2 added `conversation`; a version-1 file is read as an agent without one.
MANIFEST_FORMAT_VERSION = 2
_READABLE_VERSIONS = (1, 2)
_T = TypeVar("_T")


@dataclass(slots=True, frozen=True)
class AgentManifest:
    """An agent's cache on disk: its full blocks' hashes in order and its partial tail block.

    It only names blocks, which are shared and content-addressed, so deleting an agent removes
    its manifest, never blocks that other agents may share. In JSON, hashes are 16-hex-digit
    strings like the file names, since JSON numbers above 2**53 lose precision in many readers.

    `conversation` is the dialogue the direct agent API keeps (None for an agent that only
    chat requests named): it lives here, in the agent's one file, so that an agent, its cache
    and its history are created, forked and deleted together, each change one atomic rename.
    """

    agent_id: str
    model_tag: str
    block_hashes: list[int]
    tail_hash: int | None
    num_tokens: int
    pinned: bool = False
    conversation: Conversation | None = None
    updated_at: float = field(default_factory=time.time)
    format_version: int = MANIFEST_FORMAT_VERSION

    @property
    def hashes(self) -> list[int]:
        """Every block it names: the full blocks' hashes in order, then the tail's if any."""
        return [*self.block_hashes, *([self.tail_hash] if self.tail_hash is not None else [])]


def save_manifest(root_for_model: Path, manifest: AgentManifest) -> None:
    """Write `agents/<agent_id>.json` atomically and durably (InvalidRequest for a bad id)."""
    if manifest.model_tag != root_for_model.name:
        raise ValueError(f"manifest of {manifest.model_tag!r} under {root_for_model}")
    path = _manifest_path(root_for_model, manifest.agent_id)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    raw = {
        "format_version": manifest.format_version,
        "agent_id": manifest.agent_id,
        "model_tag": manifest.model_tag,
        "block_hashes": [f"{h:016x}" for h in manifest.block_hashes],
        "tail_hash": None if manifest.tail_hash is None else f"{manifest.tail_hash:016x}",
        "num_tokens": manifest.num_tokens,
        "pinned": manifest.pinned,
        "conversation": None if manifest.conversation is None else manifest.conversation.to_json(),
        "updated_at": manifest.updated_at,
    }
    write_durably(path, json.dumps(raw, indent=1).encode())


def load_manifest(root_for_model: Path, agent_id: str) -> AgentManifest | None:
    """The agent's manifest; None when absent or bad (a bad one is moved to `quarantine/`)."""
    path = _manifest_path(root_for_model, agent_id)
    try:
        data = path.read_bytes()
    except OSError as exc:
        if not isinstance(exc, FileNotFoundError):
            log.warning("agent manifest %s unreadable: %s", path.name, exc)
        return None
    try:
        manifest = _manifest_from_json(data)
        if manifest.model_tag != root_for_model.name or manifest.agent_id != agent_id:
            raise Rejected(QuarantineReason.OTHER_MODEL, "written for another model or agent")
    except Rejected as rejected:
        move_to_quarantine(path, root_for_model / "quarantine", rejected.reason)
        log.warning("agent manifest %s quarantined: %s", path.name, rejected)
        return None
    return manifest


def list_manifests(root_for_model: Path) -> list[AgentManifest]:
    """Every valid manifest of this model, by agent id; bad ones are quarantined on the way."""
    folder = root_for_model / "agents"
    if not folder.is_dir():
        return []
    ids = sorted(p.stem for p in folder.glob("*.json") if is_valid_agent_id(p.stem))
    return [m for agent_id in ids if (m := load_manifest(root_for_model, agent_id)) is not None]


def delete_manifest(root_for_model: Path, agent_id: str) -> bool:
    """Remove an agent's manifest durably (a deleted agent must not return after a crash)."""
    path = _manifest_path(root_for_model, agent_id)
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    fsync_dir(path.parent)
    return True


def _manifest_path(root_for_model: Path, agent_id: str) -> Path:
    if not is_valid_agent_id(agent_id):
        raise InvalidRequest(f"invalid agent id {agent_id[:40]!r}", param="agent_id")
    return root_for_model / "agents" / f"{agent_id}.json"


def _manifest_from_json(data: bytes) -> AgentManifest:
    try:
        raw = json.loads(data)
        if not isinstance(raw, dict):
            raise TypeError("not a JSON object")
        version = raw.get("format_version")
        if version not in _READABLE_VERSIONS or isinstance(version, bool):
            raise Rejected(QuarantineReason.VERSION, f"format {version!r}")
        tail, conversation = raw["tail_hash"], raw.get("conversation")
        return AgentManifest(
            agent_id=_typed(raw, "agent_id", str),
            model_tag=_typed(raw, "model_tag", str),
            block_hashes=[parse_hash(h) for h in _typed(raw, "block_hashes", list)],
            tail_hash=None if tail is None else parse_hash(tail),
            num_tokens=_typed(raw, "num_tokens", int),
            pinned=bool(raw.get("pinned", False)),
            conversation=None if conversation is None else Conversation.from_json(conversation),
            updated_at=float(_typed(raw, "updated_at", (int, float))),
            format_version=MANIFEST_FORMAT_VERSION,
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise Rejected(QuarantineReason.CORRUPT, str(exc)) from exc


def _typed(raw: dict[str, object], key: str, kind: type[_T] | tuple[type[_T], ...]) -> _T:
    value = raw[key]
    if not isinstance(value, kind):
        raise TypeError(f"{key} is not a {kind}")
    return value
