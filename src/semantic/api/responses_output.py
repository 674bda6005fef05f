"""A Responses API answer's output items (messages, reasoning, function and freeform tool
calls) as they are built from a reply's events, and the stream events that build them: one
sequence of events for a stream, the same items for a whole answer (api/responses.py)."""

from __future__ import annotations

import uuid
from typing import Any

from semantic.api.logprobs import Trail
from semantic.api.openai_tools import tool_call_id
from semantic.api.responses_request import Tool
from semantic.api.seal import Seals
from semantic.api.tool_use import ParsedCall, ReasoningDelta, ReplyEvent
from semantic.text.tools import ArgumentsDelta, CallEnd, CallStart, TextDelta


def item_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


class OutputItems:
    """A response's output items as they are built, and the stream events that build them:
    one event list for a stream, the same items for a whole answer. Items open when their first
    content comes and are done before the next one opens."""

    def __init__(
        self,
        tools: list[tuple[Tool, str | None]],
        seals: Seals | None = None,
        trail: Trail | None = None,
    ) -> None:
        """`tools`: the offered tools with their namespaces (a call of a freeform `custom` tool
        is a `custom_tool_call`, a namespaced one names its namespace). `seals`: reasoning items
        carry `encrypted_content`, sealed with them (None: they carry none). `trail`: the
        reply's log probabilities, when its request asked: a text delta carries those of the
        tokens that came with it, the reasoning's and the calls' are left out."""
        self.items: list[dict[str, Any]] = []
        self.trail = trail
        self.custom_tools = {tool.name for tool, _ in tools if tool.type == "custom"}
        self.namespaces = {tool.name: space for tool, space in tools if space is not None}
        self.seals = seals
        self._open: dict[str, Any] | None = None
        self._sequence = 0

    def event(self, payload: dict[str, Any]) -> dict[str, Any]:
        payload["sequence_number"] = self._sequence
        self._sequence += 1
        return payload

    def feed(self, event: ReplyEvent) -> list[dict[str, Any]]:
        logprobs = self._logprobs()  # the tokens that came with this event
        if isinstance(event, TextDelta):
            return self._text(event.text, logprobs)
        if isinstance(event, ReasoningDelta):
            return self._reasoning(event.text)
        if isinstance(event, CallStart):
            return self._close() + self._start_call(event.name)
        if isinstance(event, ArgumentsDelta):
            return self._arguments(event.json)
        assert isinstance(event, CallEnd)
        return self._close()

    def close(self) -> list[dict[str, Any]]:
        return self._close()

    def _logprobs(self) -> list[dict[str, Any]]:
        if self.trail is None or not self.trail.asked:
            return []
        return self.trail.entries(self.trail.take())

    def _text(self, text: str, logprobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        if self._open is None or self._open["type"] != "message":
            events += self._close()
            item: dict[str, Any] | None = {
                "id": item_id("msg"),
                "type": "message",
                "status": "in_progress",
                "role": "assistant",
                "content": [],
            }
            assert item is not None
            events += self._add(item)
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            item["content"].append(part)
            events.append(self._part_event("response.content_part.added", item, dict(part)))
        item = self._open
        assert item is not None
        item["content"][0]["text"] += text
        item["content"][0]["logprobs"] += logprobs
        delta: dict[str, Any] = {"type": "response.output_text.delta", "item_id": item["id"]}
        delta |= {"output_index": self._index, "content_index": 0, "delta": text}
        delta["logprobs"] = logprobs
        return [*events, self.event(delta)]

    def _reasoning(self, text: str) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        if self._open is None or self._open["type"] != "reasoning":
            events += self._close()
            new: dict[str, Any] = {"id": item_id("rs"), "type": "reasoning", "summary": []}
            new["content"] = []
            events += self._add(new)
            new["content"].append({"type": "reasoning_text", "text": ""})
        item = self._open
        assert item is not None
        item["content"][0]["text"] += text
        delta: dict[str, Any] = {"type": "response.reasoning_text.delta", "item_id": item["id"]}
        delta |= {"output_index": self._index, "content_index": 0, "delta": text}
        return [*events, self.event(delta)]

    def _start_call(self, name: str) -> list[dict[str, Any]]:
        item: dict[str, Any]
        if name in self.custom_tools:
            item = {"id": item_id("ctc"), "type": "custom_tool_call", "input": ""}
        else:
            item = {"id": item_id("fc"), "type": "function_call", "arguments": ""}
        item |= {"call_id": tool_call_id(), "name": name, "status": "in_progress"}
        if name in self.namespaces:
            item["namespace"] = self.namespaces[name]
        item["_arguments"] = ""
        return self._add(item) if item["type"] == "function_call" else self._hold(item)

    def _arguments(self, text: str) -> list[dict[str, Any]]:
        item = self._open
        assert item is not None
        item["_arguments"] += text
        if item["type"] != "function_call":
            return []  # a freeform call's input is known once its arguments are whole
        item["arguments"] += text
        delta = {"type": "response.function_call_arguments.delta", "item_id": item["id"]}
        return [self.event(delta | {"output_index": self._index, "delta": text})]

    def _close(self) -> list[dict[str, Any]]:
        item = self._open
        if item is None:
            return []
        self._open = None
        item["status"] = "completed"
        arguments = item.pop("_arguments", "")
        events = []
        if item["type"] == "reasoning":
            text = item["content"][0]["text"]
            item["encrypted_content"] = None if self.seals is None else self.seals.seal(text)
            done = {"type": "response.reasoning_text.done", "item_id": item["id"]}
            done |= {"output_index": self._index, "content_index": 0, "text": text}
            events.append(self.event(done))
        elif item["type"] == "message":
            part = item["content"][0]
            done = {"type": "response.output_text.done", "item_id": item["id"]}
            done |= {"output_index": self._index, "content_index": 0}
            events.append(self.event(done | {"text": part["text"], "logprobs": part["logprobs"]}))
            events.append(self._part_event("response.content_part.done", item, dict(part)))
        elif item["type"] == "function_call":
            done = {"type": "response.function_call_arguments.done", "item_id": item["id"]}
            done |= {"output_index": self._index, "arguments": item["arguments"]}
            events.append(self.event(done | {"name": item["name"]}))
        else:
            item["input"] = _freeform_input(arguments)
            events += self._add(item, opened=False)
        done_item = {"type": "response.output_item.done", "output_index": self._index}
        return [*events, self.event(done_item | {"item": public(item)})]

    @property
    def _index(self) -> int:
        return len(self.items) - 1

    def _add(self, item: dict[str, Any], opened: bool = True) -> list[dict[str, Any]]:
        if opened:
            self.items.append(item)
            self._open = item
        added = {"type": "response.output_item.added", "output_index": self._index}
        return [self.event(added | {"item": public(item, in_progress=True)})]

    def _hold(self, item: dict[str, Any]) -> list[dict[str, Any]]:
        self.items.append(item)
        self._open = item
        return []

    def _part_event(self, kind: str, item: dict[str, Any], part: dict[str, Any]) -> dict[str, Any]:
        payload = {"type": kind, "item_id": item["id"], "output_index": self._index}
        return self.event(payload | {"content_index": 0, "part": part})


def public(item: dict[str, Any], in_progress: bool = False) -> dict[str, Any]:
    """An item as the client sees it: no private fields; just added, it has no content yet."""
    public = {key: value for key, value in item.items() if not key.startswith("_")}
    if in_progress:
        public = dict(public, status="in_progress")
        if public["type"] in ("message", "reasoning"):
            public["content"] = []
    return public


def _freeform_input(arguments: str) -> str:
    """A custom tool's input: the `input` string of the arguments the model wrote."""
    value = ParsedCall("", arguments).input().get("input")
    return value if isinstance(value, str) else arguments
