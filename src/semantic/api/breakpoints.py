"""Anthropic cache breakpoints: the `cache_control` marks of a Messages body, checked as the
real API checks them, and the token each one falls after in the rendered prompt.

The prompt is rendered by a chat template from text, so a block's end has no token position of
its own. A copy of the body gets a marker (random, so no client can forge one) at the end of
each marked block and is rendered too: a mark falls where the marked render, markers taken
out, stops agreeing with the real one before its marker, after the last of the real prompt's
tokens that ends there (one tokenization, with offsets). Whatever a marker changes (a template
that trims, text the Claude Code hygiene rewrites) can only move a breakpoint earlier, never
past its block; a marker the render drops (a block the model does not read) drops its
breakpoint.
"""

from __future__ import annotations

import itertools
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from semantic.api.anthropic_request import (
    CacheControl,
    ContentBlock,
    MessagesBody,
    OtherBlock,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
    render_text,
)
from semantic.api.seal import Seals
from semantic.cache.pages.prefix import common_prefix
from semantic.core import Breakpoint
from semantic.errors import InvalidRequest
from semantic.models.served import ServedModel

MAX_BREAKPOINTS = 4  # Anthropic's limit, automatic caching's included
TTL_S = {"5m": 300.0, "1h": 3600.0}


@dataclass(slots=True, frozen=True)
class Mark:
    """One `cache_control` of a body: where (`tools.1`, `system.0`, `messages.2.content.0`, or
    `cache_control` for automatic caching's, at the last block) and its time to live."""

    where: str
    ttl: str  # "5m" or "1h"


def marks_of(body: MessagesBody) -> list[Mark]:
    """The body's breakpoints in the order the prompt is cached (tools, system, messages);
    a 400 for more than `MAX_BREAKPOINTS`, or a 1h one after a 5m one."""
    found: list[tuple[str, CacheControl | None]] = [
        (f"tools.{i}", tool.cache_control) for i, tool in enumerate(body.tools or [])
    ]
    if isinstance(body.system, list):
        found += [(f"system.{i}", _control(b, f"system.{i}")) for i, b in enumerate(body.system)]
    for m, message in enumerate(body.messages):
        blocks = message.content if isinstance(message.content, list) else []
        for i, block in enumerate(blocks):
            where = f"messages.{m}.content.{i}"
            found.append((where, _control(block, where)))
    found.append(("cache_control", body.cache_control))
    marks = [Mark(where, control.ttl or "5m") for where, control in found if control is not None]
    if len(marks) > MAX_BREAKPOINTS:
        raise InvalidRequest(
            f"A maximum of {MAX_BREAKPOINTS} blocks with cache_control may be provided. "
            f"Found {len(marks)}."
        )
    for earlier, later in itertools.pairwise(marks):
        if earlier.ttl == "5m" and later.ttl == "1h":
            raise InvalidRequest(
                f"{later.where}.cache_control: a ttl='1h' cache_control block must not come "
                f"after a ttl='5m' cache_control block ({earlier.where}); blocks are cached in "
                "the order tools, system, messages"
            )
    return marks


def _control(block: ContentBlock, where: str) -> CacheControl | None:
    """A block's `cache_control`: a field of the blocks we read, checked alike on the others."""
    if not isinstance(block, OtherBlock):
        return getattr(block, "cache_control", None)
    raw = (block.model_extra or {}).get("cache_control")
    if raw is None:
        return None
    try:
        return CacheControl.model_validate(raw)
    except ValidationError as exc:
        error = exc.errors(include_url=False)[0]
        path = ".".join(str(part) for part in error["loc"])
        raise InvalidRequest(f"{where}.cache_control.{path}: {error['msg']}") from None


Markers = list[tuple[str, Mark]]  # (marker, the mark it stands for)


class BreakpointRender:
    """`render_prompt` for `shape_reply`, which also finds where the body's marks fall:
    `breakpoints` (with each one's `labels`, 5m or 1h) once it has rendered. Times to live are
    cut to `max_ttl_s`; a mark that falls before the first token keeps nothing and is left
    out."""

    def __init__(
        self,
        model: ServedModel,
        body: MessagesBody,
        max_ttl_s: float,
        *,
        seals: Seals | None = None,
        git_status: str | None = None,
    ) -> None:
        self.model = model
        self.body = body
        self.marks = marks_of(body)
        self.max_ttl_s = max_ttl_s
        self.options: dict[str, Any] = {"seals": seals, "git_status": git_status}
        self.breakpoints: tuple[Breakpoint, ...] = ()
        self.labels: tuple[str, ...] = ()

    def __call__(
        self, reply_start: str = "", template_vars: Mapping[str, Any] | None = None
    ) -> list[int]:
        text = render_text(self.model, self.body, reply_start, template_vars, **self.options)
        if not self.marks or self.max_ttl_s <= 0:
            return self.model.tokenizer.encode(text)
        ids, ends = self.model.tokenizer.encode_with_ends(text)
        body, markers = _with_markers(self.body, self.marks)
        marked = render_text(self.model, body, reply_start, template_vars, **self.options)
        found = [(_position(marked, m, markers, text, ends), mark.ttl) for m, mark in markers]
        kept = [(n, ttl) for n, ttl in found if n > 0]
        self.breakpoints = tuple(Breakpoint(n, min(TTL_S[t], self.max_ttl_s)) for n, t in kept)
        self.labels = tuple(ttl for _, ttl in kept)
        return ids


def _position(marked: str, marker: str, markers: Markers, text: str, ends: list[int]) -> int:
    """How many of the real prompt's tokens (`text`, each ending at `ends[i]`) come before
    `marker`'s place: 0 when the render lost it."""
    end = marked.find(marker)
    if end < 0:
        return 0
    before = marked[:end]
    for other, _ in markers:
        before = before.replace(other, "")
    chars = common_prefix(before, text)
    return next((i for i, token_end in enumerate(ends) if token_end > chars), len(ends))


def _with_markers(body: MessagesBody, marks: list[Mark]) -> tuple[MessagesBody, Markers]:
    """A copy of `body` with a marker at the end of each marked block, and the markers."""
    copy = body.model_copy(deep=True)
    nonce = secrets.token_hex(8)
    markers = [(f"SEMANTICBREAKPOINT{i}X{nonce}", mark) for i, mark in enumerate(marks)]
    for marker, mark in markers:
        _put(copy, mark.where, marker)
    return copy, markers


def _put(body: MessagesBody, where: str, marker: str) -> None:
    """Append `marker` to the text of the block at `where` (the last message's end, for
    automatic caching)."""
    parts = where.split(".")
    if parts[0] == "tools":
        tool = (body.tools or [])[int(parts[1])]
        tool.description = (tool.description or "") + marker
        return
    if parts[0] == "system":
        assert isinstance(body.system, list)
        body.system[int(parts[1])] = _marked(body.system[int(parts[1])], marker)
        return
    message = body.messages[-1] if parts[0] == "cache_control" else body.messages[int(parts[1])]
    if isinstance(message.content, str):
        message.content = message.content + marker
    elif parts[0] == "cache_control":
        message.content.append(TextBlock(type="text", text=marker))
    else:
        message.content[int(parts[3])] = _marked(message.content[int(parts[3])], marker)


def _marked(block: ContentBlock, marker: str) -> ContentBlock:
    if isinstance(block, TextBlock):
        return block.model_copy(update={"text": block.text + marker})
    if isinstance(block, ToolUseBlock):  # its input is rendered as JSON: the marker last
        return block.model_copy(update={"input": {**block.input, marker: marker}})
    if isinstance(block, ToolResultBlock):
        content = block.content
        if isinstance(content, list):
            tail = TextBlock(type="text", text=marker)
            return block.model_copy(update={"content": [*content, tail]})
        return block.model_copy(update={"content": (content or "") + marker})
    return block  # not read by the model: its breakpoint goes with its marker
