"""An agent's conversation, kept by the server for the direct agent API: its system prompt, its
sampling defaults and its messages, their JSON form on disk, and the digest that names it there.

Plain values only: the API renders a conversation through the model's chat template, the agent
store keeps the current one per agent, and `cache/agents/conversation_files.py` writes it to disk.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, Literal

Role = Literal["user", "assistant"]


@dataclass(slots=True, frozen=True)
class Message:
    role: Role
    content: str


@dataclass(slots=True, frozen=True)
class SamplingDefaults:
    """Sampling settings an agent was created with, or a call's overrides; None leaves a
    setting to the next level (call > agent > server)."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    max_tokens: int | None = None
    stop: tuple[str, ...] | None = None
    seed: int | None = None

    def overridden_by(self, other: SamplingDefaults) -> SamplingDefaults:
        """These settings, with every one that `other` sets taken from `other`."""
        changes = {f.name: v for f in fields(other) if (v := getattr(other, f.name)) is not None}
        return replace(self, **changes)

    def to_json(self) -> dict[str, Any]:
        """The settings that are set, as JSON values."""
        return {k: list(v) if k == "stop" else v for k, v in asdict(self).items() if v is not None}

    @classmethod
    def from_json(cls, raw: object) -> SamplingDefaults:
        """Raises TypeError or ValueError for anything `to_json` could not have written."""
        if not isinstance(raw, dict):
            raise TypeError("defaults is not a JSON object")
        known = {f.name for f in fields(cls)}
        if not set(raw) <= known:
            raise ValueError(f"unknown defaults {sorted(set(raw) - known)}")
        values = dict(raw)
        if "stop" in values:
            stop = values["stop"]
            if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
                raise TypeError("defaults.stop is not a list of strings")
            values["stop"] = tuple(stop)
        for name in ("temperature", "top_p"):
            if name in values and not isinstance(values[name], int | float):
                raise TypeError(f"defaults.{name} is not a number")
        for name in ("top_k", "max_tokens", "seed"):
            if name in values and not isinstance(values[name], int):
                raise TypeError(f"defaults.{name} is not an integer")
        return cls(**values)


@dataclass(slots=True, frozen=True)
class Conversation:
    """What the server remembers of an agent's dialogue. Immutable: a turn makes a new one, so
    another thread that read the old one (a manifest being written) still sees a whole value,
    and forks hold one value between them rather than copies.

    Its size and digest are worked out once per value (`_text_bytes`, `_digest`): a value may
    hold megabytes, and the agents sharing it ask for them at every list, save and turn."""

    system: str | None = None
    defaults: SamplingDefaults = field(default_factory=SamplingDefaults)
    messages: tuple[Message, ...] = ()
    _text_bytes: int | None = field(default=None, init=False, repr=False, compare=False)
    _digest: str | None = field(default=None, init=False, repr=False, compare=False)

    def with_turn(self, user: str, assistant: str) -> Conversation:
        turn = (Message("user", user), Message("assistant", assistant))
        longer = replace(self, messages=(*self.messages, *turn))
        added = _utf8_size(user) + _utf8_size(assistant)
        object.__setattr__(longer, "_text_bytes", self.text_bytes() + added)
        return longer

    def text_bytes(self) -> int:
        """The size of its text, system prompt and messages, in UTF-8 bytes: what the limits on
        stored conversations count."""
        if self._text_bytes is None:
            texts = [self.system or "", *(m.content for m in self.messages)]
            object.__setattr__(self, "_text_bytes", sum(map(_utf8_size, texts)))
        assert self._text_bytes is not None
        return self._text_bytes

    def digest(self) -> str:
        """The name of its file on disk: a digest of `to_bytes` (or of the stored bytes it was
        read from), so equal conversations share one file."""
        if self._digest is None:
            object.__setattr__(self, "_digest", digest_of(self.to_bytes()))
        assert self._digest is not None
        return self._digest

    def to_bytes(self) -> bytes:
        """Its JSON form on disk, the same bytes for the same value (keys sorted, no spaces)."""
        return json.dumps(self.to_json(), sort_keys=True, separators=(",", ":")).encode()

    def template_messages(self, user: str) -> list[dict[str, Any]]:
        """The whole dialogue plus a new user message, as chat templates expect it."""
        system = [] if self.system is None else [{"role": "system", "content": self.system}]
        history = [{"role": m.role, "content": m.content} for m in self.messages]
        return [*system, *history, {"role": "user", "content": user}]

    def to_json(self) -> dict[str, Any]:
        return {
            "system": self.system,
            "defaults": self.defaults.to_json(),
            "messages": [{"role": m.role, "content": m.content} for m in self.messages],
        }

    @classmethod
    def from_json(cls, raw: object) -> Conversation:
        """Raises TypeError, ValueError or KeyError for anything `to_json` could not have
        written (the manifest then quarantines the file)."""
        if not isinstance(raw, dict):
            raise TypeError("conversation is not a JSON object")
        system = raw["system"]
        if system is not None and not isinstance(system, str):
            raise TypeError("conversation.system is not a string")
        messages = raw["messages"]
        if not isinstance(messages, list):
            raise TypeError("conversation.messages is not a list")
        return cls(
            system, SamplingDefaults.from_json(raw["defaults"]), tuple(map(_message, messages))
        )

    @classmethod
    def stored(cls, raw: object, digest: str) -> Conversation:
        """`from_json` of a file read from disk, named by `digest` from then on."""
        conversation = cls.from_json(raw)
        object.__setattr__(conversation, "_digest", digest)
        return conversation


def digest_of(data: bytes) -> str:
    """The name a conversation's bytes are stored under: 32 hex digits."""
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def _utf8_size(text: str) -> int:
    return len(text.encode(errors="replace"))


def _message(raw: object) -> Message:
    if not isinstance(raw, dict) or set(raw) != {"role", "content"}:
        raise ValueError("a message is not {role, content}")
    role, content = raw["role"], raw["content"]
    if role not in ("user", "assistant") or not isinstance(content, str):
        raise ValueError(f"a message has role {role!r} or content that is not a string")
    return Message(role, content)
