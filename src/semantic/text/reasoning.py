"""A thinking model's reasoning, told apart from its answer as the output streams, and the
switches that turn it on and off.

Two families of format, told by the markers the chat template writes:
- think tags (Qwen3, DeepSeek-R1 style): `<think>\\n…\\n</think>\\n\\n` then the answer; the
  template's `enable_thinking` turns it off (it then writes an empty think block itself).
- harmony channels (GPT-OSS): `<|channel|>analysis<|message|>…<|end|>` then
  `<|start|>assistant<|channel|>final<|message|>…`; `reasoning_effort` sets how much.

Reasoning goes back to clients as the protocol's thinking blocks, each with its seal (the
opaque string those blocks carry: api/seal.py), so the next prompt renders exactly what the
model wrote (its cache holds).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from semantic.text.chat import ChatTemplate
from semantic.text.tokenizer import Tokenizer

Effort = Literal["low", "medium", "high"]


@dataclass(slots=True, frozen=True)
class ThinkingSwitch:
    """What a request asks of a thinking model: `enabled` None leaves the model's default;
    `effort` None likewise."""

    enabled: bool | None = None
    effort: Effort | None = None

    @classmethod
    def from_effort(cls, effort: str | None) -> ThinkingSwitch:
        """OpenAI's reasoning effort: `none` / `minimal` turn thinking off, the others on."""
        if effort is None:
            return cls()
        if effort in ("none", "minimal"):
            return cls(enabled=False, effort="low")
        return cls(enabled=True, effort=effort_level(effort))


def effort_level(effort: str | None) -> Effort | None:
    """An effort name as the templates know them (`xhigh` and `max` are `high`)."""
    if effort is None:
        return None
    if effort in ("low", "medium"):
        return effort  # type: ignore[return-value]
    return "high"


@dataclass(slots=True, frozen=True)
class ReasoningFormat:
    """How a model writes its reasoning: `opener` starts it, `closer` ends it; for harmony,
    `answer` opens the answer that follows."""

    kind: Literal["think", "harmony"]
    opener: str
    closer: str
    answer: str = ""

    @property
    def markers(self) -> tuple[str, ...]:
        return (self.opener, self.closer) + ((self.answer,) if self.answer else ())

    def template_vars(self, switch: ThinkingSwitch, constrained: bool) -> dict[str, Any]:
        """The chat template's switches for this request. Output held to a grammar (structured
        output) has no room for reasoning: thinking is off."""
        variables: dict[str, Any] = {}
        enabled = False if constrained else switch.enabled
        if self.kind == "think" and enabled is not None:
            variables["enable_thinking"] = enabled
        if self.kind == "harmony" and switch.effort is not None:
            variables["reasoning_effort"] = switch.effort
        return variables

    def answer_prefill(self, constrained: bool) -> str:
        """Text the reply is forced to start with: harmony's final channel when output is
        held to a grammar (the model cannot be told not to reason, only to answer now)."""
        return _HARMONY_FINAL if constrained and self.kind == "harmony" else ""


THINK_TAGS = ReasoningFormat("think", "<think>", "</think>")
_HARMONY_FINAL = "<|channel|>final<|message|>"
HARMONY = ReasoningFormat("harmony", "<|channel|>analysis<|message|>", "<|end|>", _HARMONY_FINAL)


def reasoning_format(template: ChatTemplate) -> ReasoningFormat | None:
    """The reasoning format a chat template's model writes, if it writes one."""
    if "<|channel|>" in template.source:
        return HARMONY
    if "<think>" in template.source:
        return THINK_TAGS
    return None


def hidden_markers(fmt: ReasoningFormat, tokenizer: Tokenizer) -> dict[int, str]:
    """Special tokens the detokenizer drops from text that the reasoning parser must see
    (`<|channel|>`, `<|end|>`, …), by id, with their text."""
    names = {"<|channel|>", "<|message|>", "<|end|>", "<|start|>", "<|return|>", "<|call|>"}
    names |= {fmt.opener, fmt.closer} if fmt.kind == "think" else set()
    hidden = {}
    for name in names:
        token_id = tokenizer.token_to_id(name)
        if token_id is not None and tokenizer.is_special(token_id):
            hidden[token_id] = name
    return hidden


@dataclass(slots=True, frozen=True)
class Piece:
    """A stretch of output: reasoning, or answer text."""

    text: str
    reasoning: bool


class ReasoningParser:
    """Splits streamed output into reasoning and answer, holding back only what may be the
    start of a marker.

    Think tags: reasoning runs from `<think>` (or from the start, when the prompt opened it) to
    `</think>`; the newlines the template puts around it are dropped, so that the reasoning
    and the answer sent back render the very text the model wrote. Harmony: the analysis
    channel is reasoning, a final (or commentary) channel is the answer, and the framing
    tokens between them are dropped."""

    def __init__(self, fmt: ReasoningFormat, *, started: bool = False) -> None:
        self.fmt = fmt
        self._in_reasoning = started
        self._seen_any = started  # reasoning may only open before the answer has begun
        self._held = ""
        self._trim_next = started  # drop the newlines right after a marker
        self._skip_to: str | None = None  # harmony: text up to this marker is framing
        self._channel = ""  # harmony: the name of the channel being read

    def feed(self, text: str) -> list[Piece]:
        self._held += text
        pieces: list[Piece] = []
        while self._held:
            if self._skip_to is not None:
                if not self._skip(self._skip_to):
                    break
                continue
            marker, at = self._next_marker()
            if marker is None:
                keep = len(self._held) - self._emittable()
                self._emit(pieces, self._held[: len(self._held) - keep])
                self._held = self._held[len(self._held) - keep :]
                break
            before = self._held[:at]
            if marker == self.fmt.closer and self.fmt.kind == "think":
                before = before.rstrip("\n")  # the template's newline before </think>
            if marker == self.fmt.opener and before.strip():
                # The answer had begun: a think tag in it is text.
                self._emit(pieces, self._held[: at + len(marker)])
                self._held = self._held[at + len(marker) :]
                self._seen_any = True
                continue
            if marker == self.fmt.opener:
                before = ""  # whitespace before the reasoning opens is no answer
            self._emit(pieces, before)
            self._held = self._held[at + len(marker) :]
            self._on_marker(marker)
        return pieces

    def _emittable(self) -> int:
        """How much of the held text can go out, no marker being in it: all but a possible
        marker start, the trailing newlines of reasoning (the template's, if `</think>`
        follows), and whitespace before a reasoning that may still open."""
        held = self._held
        keep = _partial_marker(held, self._markers())
        if self.fmt.kind == "think" and self._in_reasoning:
            rest = held[: len(held) - keep]
            keep += len(rest) - len(rest.rstrip("\n"))
        if self.fmt.kind == "think" and not self._seen_any and not held.strip():
            keep = len(held)
        return len(held) - keep

    def finish(self) -> list[Piece]:
        pieces: list[Piece] = []
        if self._skip_to is None:
            self._emit(pieces, self._held)
        self._held = ""
        return pieces

    def _markers(self) -> tuple[str, ...]:
        fmt = self.fmt
        if fmt.kind == "think":
            if self._in_reasoning:
                return (fmt.closer,)
            return () if self._seen_any else (fmt.opener,)
        return ("<|channel|>", "<|end|>", "<|start|>", "<|return|>", "<|call|>")

    def _next_marker(self) -> tuple[str | None, int]:
        found: tuple[str | None, int] = (None, len(self._held))
        for marker in self._markers():
            at = self._held.find(marker)
            if at >= 0 and at < found[1]:
                found = (marker, at)
        return found

    def _on_marker(self, marker: str) -> None:
        if self.fmt.kind == "think":
            self._in_reasoning = marker == self.fmt.opener
            self._seen_any = True
            self._trim_next = True
        elif marker == "<|channel|>":
            self._skip_to = "<|message|>"
            self._channel = ""
        elif marker == "<|start|>":
            self._skip_to = "<|channel|>"
        # <|end|>, <|return|>, <|call|>: a message ends; the next one says its channel

    def _skip(self, until: str) -> bool:
        """Harmony framing: drop text up to `until` (reading a channel's name on the way)."""
        at = self._held.find(until)
        if at < 0:
            keep = _partial_marker(self._held, (until,))
            if until == "<|message|>":
                self._channel += self._held[: len(self._held) - keep]
            self._held = self._held[len(self._held) - keep :]
            return False
        if until == "<|message|>":
            self._channel += self._held[:at]
            self._in_reasoning = self._channel.strip().startswith("analysis")
            self._held = self._held[at + len(until) :]
            self._skip_to = None
        else:  # <|start|>assistant… then <|channel|>
            self._held = self._held[at:]
            self._skip_to = None
        return True

    def _emit(self, pieces: list[Piece], text: str) -> None:
        if self._trim_next and self.fmt.kind == "think":
            text = text.lstrip("\n")
            if not text:
                return
            self._trim_next = False
        if not text:
            return
        if not self._in_reasoning and self.fmt.kind == "think":
            self._seen_any = True
        if pieces and pieces[-1].reasoning == self._in_reasoning:
            pieces[-1] = Piece(pieces[-1].text + text, self._in_reasoning)
        else:
            pieces.append(Piece(text, self._in_reasoning))


def _partial_marker(text: str, markers: tuple[str, ...]) -> int:
    """How many characters at the end of `text` may be the start of a marker."""
    longest = 0
    for marker in markers:
        for size in range(min(len(marker) - 1, len(text)), 0, -1):
            if marker.startswith(text[-size:]):
                longest = max(longest, size)
                break
    return longest
