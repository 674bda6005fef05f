"""OpenAI's side of tool calls: `tools`, `tool_choice` and
`parallel_tool_calls` read and checked, and parsed calls written as `tool_calls`, whole or as
stream deltas.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from semantic.api.tool_use import ParsedCall, ToolChoice, ToolUse
from semantic.errors import InvalidRequest
from semantic.models.served import ServedModel
from semantic.text.tools import ArgumentsDelta, CallStart, ToolEvent


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True, allow_inf_nan=False)


class FunctionDefinition(_Body):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolDefinition(_Body):
    type: Literal["function"]
    function: FunctionDefinition


class FunctionName(_Body):
    name: str


class NamedToolChoice(_Body):
    type: Literal["function"]
    function: FunctionName


ToolChoiceField = Literal["none", "auto", "required"] | NamedToolChoice

# The JSON schema of "a `tool_choice` that asks for a call needs `tools`" (`tool_use_of`).
CHOICE_NEEDS_TOOLS: dict[str, Any] = {
    "if": {
        "properties": {"tool_choice": {"anyOf": [{"const": "required"}, {"type": "object"}]}},
        "required": ["tool_choice"],
    },
    "then": {"required": ["tools"], "properties": {"tools": {"type": "array", "minItems": 1}}},
}


def template_tools(tools: list[ToolDefinition] | None) -> list[dict[str, Any]] | None:
    """The tools in the function shape chat templates read (as sent, less unset fields)."""
    if not tools:
        return None
    return [tool.model_dump(exclude_none=True) for tool in tools]


def tool_use_of(
    model: ServedModel,
    tools: list[ToolDefinition] | None,
    choice: ToolChoiceField | None,
    parallel: bool,
) -> ToolUse:
    """The tools the model may call and how (with their schemas, and which are `strict`); a
    400 for duplicate names, or a `tool_choice` that asks for a call with no tools or names a
    function that is not among them."""
    functions = [tool.function for tool in tools or []]
    names = [function.name for function in functions]
    if len(set(names)) < len(names):
        raise InvalidRequest("tools: function names must be unique", param="tools")
    schemas = {f.name: f.parameters for f in functions if f.parameters is not None}
    strict = [function.name for function in functions if function.strict]
    if choice is None or choice in ("auto", "none"):
        mode: Literal["auto", "required", "none"] = "none" if choice == "none" else "auto"
        return ToolUse(model, names, ToolChoice(mode, None, parallel), schemas, strict)
    if not names:
        raise InvalidRequest(
            "tool_choice is only allowed when tools are specified", param="tool_choice"
        )
    name = None if isinstance(choice, str) else choice.function.name
    if name is not None and name not in names:
        raise InvalidRequest(
            f"tool_choice names the function {name!r}, which is not in tools",
            param="tool_choice",
        )
    return ToolUse(model, names, ToolChoice("required", name, parallel), schemas, strict)


def tool_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def tool_calls_json(parts: Sequence[object]) -> list[dict[str, Any]]:
    """`message.tool_calls` of a whole answer; `arguments` is the JSON text the model wrote."""
    return [
        {
            "id": tool_call_id(),
            "type": "function",
            "function": {"name": part.name, "arguments": part.arguments},
        }
        for part in parts
        if isinstance(part, ParsedCall)
    ]


def tool_call_delta(event: ToolEvent) -> dict[str, Any] | None:
    """A call event as `delta.tool_calls`: its first delta carries the index, id, type, name and
    empty arguments, later ones the index and an arguments fragment (the SDK accumulator joins
    every string it sees again, so nothing is repeated); None for other events."""
    if isinstance(event, CallStart):
        call = {
            "index": event.index,
            "id": tool_call_id(),
            "type": "function",
            "function": {"name": event.name, "arguments": ""},
        }
    elif isinstance(event, ArgumentsDelta):
        call = {"index": event.index, "function": {"arguments": event.json}}
    else:
        return None
    return {"tool_calls": [call]}
