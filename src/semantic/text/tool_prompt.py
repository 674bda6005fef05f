"""The default tool prompt, for chat templates that have no place for tools (SmolLM2's), or
only for the tool list (SmolLM3's `xml_tools`: then only calls and results are written here).

Such a template would drop the tool list, the assistant's tool calls and the tool results, so
they are written as text in the Hermes format (`HermesParser` in text/tool_formats.py reads it
back): the tool list and the call format go into the system message, in the words Qwen 2.5's
template uses; an assistant's calls become `<tool_call>` blocks after its text; tool results
become a user turn of `<tool_response>` blocks (with any user text that follows them). JSON is
written with fixed settings in the order given, so the same conversation always renders the
same prompt, and a continuing agent keeps its cached prefix.
"""

from __future__ import annotations

import json
from typing import Any

from semantic.errors import InvalidRequest
from semantic.text import client_json

TOOLS_HEADER = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
TOOLS_FOOTER = (
    "\n</tools>\n\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)
SYSTEM_SEPARATOR = "\n\n"  # between the client's system prompt and the tools
TURN_SEPARATOR = "\n"  # between a turn's text and its calls, and between blocks


def has_tool_content(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> bool:
    """Whether there is anything for the default tool prompt to write."""
    return bool(tools) or any(
        message.get("role") == "tool" or message.get("tool_calls") for message in messages
    )


def default_tool_messages(
    messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
) -> list[dict[str, Any]]:
    """The conversation (Hugging Face message shapes) with tools, calls and results as text,
    for a template that knows only `role` and `content`."""
    rendered: list[dict[str, Any]] = []
    if tools:
        rendered.append({"role": "system", "content": _system(messages, tools)})
        if messages and messages[0].get("role") == "system":
            messages = messages[1:]
    tool_turn: int | None = None  # the user turn that tool results are being gathered into
    for message in messages:
        role = message.get("role")
        if role == "tool" or (role == "user" and tool_turn is not None):
            text = _tool_response(message) if role == "tool" else _content(message)
            if tool_turn is None:
                tool_turn = len(rendered)
                rendered.append({"role": "user", "content": text})
            else:
                rendered[tool_turn]["content"] += TURN_SEPARATOR + text
            continue
        tool_turn = None
        if role == "assistant" and message.get("tool_calls"):
            message = _with_calls_as_text(message)
        rendered.append(message)
    return rendered


def _system(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> str:
    lines = "".join("\n" + json.dumps(tool, ensure_ascii=False) for tool in tools)
    section = TOOLS_HEADER + lines + TOOLS_FOOTER
    first = messages[0] if messages else {}
    system = _content(first) if first.get("role") == "system" else ""
    return system + SYSTEM_SEPARATOR + section if system else section


def _with_calls_as_text(message: dict[str, Any]) -> dict[str, Any]:
    calls = TURN_SEPARATOR.join(_call_text(call) for call in message["tool_calls"])
    text = _content(message)
    rest = {key: value for key, value in message.items() if key != "tool_calls"}
    return rest | {"content": text + TURN_SEPARATOR + calls if text else calls}


def _call_text(call: dict[str, Any]) -> str:
    """A call as the model writes it: `{"name": …, "arguments": {…}}` in `<tool_call>` tags."""
    function = call.get("function", call)
    arguments = function.get("arguments") or {}
    if isinstance(arguments, str):  # OpenAI's JSON string, when not decoded already
        try:
            arguments = client_json.loads(arguments)
        except client_json.NotJson as exc:
            raise InvalidRequest(f"tool call arguments: the JSON string {exc}") from None
    body = json.dumps({"name": function.get("name"), "arguments": arguments}, ensure_ascii=False)
    return f"<tool_call>\n{body}\n</tool_call>"


def _tool_response(message: dict[str, Any]) -> str:
    return f"<tool_response>\n{_content(message)}\n</tool_response>"


def _content(message: dict[str, Any]) -> str:
    content = message.get("content")
    return content if isinstance(content, str) else ""
