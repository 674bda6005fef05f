"""The OpenAI Responses request (`POST /v1/responses`): its body, read and checked, and its input
items as the messages chat templates read.

Accepts generously, as Codex and the SDK send it: `input` as text or items (messages with
`input_text` / `output_text` parts, `function_call`, `function_call_output`, `reasoning`,
Codex's `custom_tool_call` and its output); item types this server has no use for (web search
calls, image generation, …) are accepted and left out of the prompt. An image or a file part is
refused: this model reads text only, and a client must know its image was not seen.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from semantic.api.logprobs import MAX_TOP_LOGPROBS
from semantic.api.openai_tools import FunctionDefinition, ToolDefinition
from semantic.api.prompt_cache import PromptCacheRetention
from semantic.api.seal import Seals
from semantic.api.structured_output import TextFormat
from semantic.core import AGENT_ID_PATTERN
from semantic.errors import InvalidRequest
from semantic.text import client_json
from semantic.text.chat import template_tool_call

RESPONSE_ID_PATTERN = r"^resp_[0-9a-f]{32}$"
# A freeform (`custom`) tool is offered to the model as a function of one string.
CUSTOM_TOOL_PARAMETERS = {
    "type": "object",
    "properties": {"input": {"type": "string"}},
    "required": ["input"],
}


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True, allow_inf_nan=False)


class Tool(_Body):
    """A function tool (flat: name and parameters beside `type`), a Codex freeform `custom`
    tool, a `namespace` of tools (Codex groups its sub-agent tools so), or a hosted tool
    (web_search, …), which is accepted and not offered."""

    type: str
    name: str | None = Field(None, max_length=256)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None
    tools: list[Tool] | None = None  # a namespace's
    format: dict[str, Any] | None = None  # a custom tool's: `text`, or a `grammar` its input obeys

    @property
    def offered(self) -> bool:
        return self.type in ("function", "custom") and self.name is not None

    def as_function(self) -> ToolDefinition:
        assert self.name is not None
        custom = self.type == "custom"
        function = FunctionDefinition(
            name=self.name,
            description=self.custom_description() if custom else self.description,
            parameters=CUSTOM_TOOL_PARAMETERS if custom else self.parameters,
            strict=self.strict,
        )
        return ToolDefinition(type="function", function=function)

    def custom_description(self) -> str | None:
        """A freeform tool's description with its grammar: offered as a function, the model
        sees no other trace of the input's syntax (Codex's apply_patch says only that it is
        "FREEFORM", its patch format is in the grammar)."""
        grammar = self.format or {}
        definition = grammar.get("definition")
        if grammar.get("type") != "grammar" or not isinstance(definition, str):
            return self.description
        syntax = grammar.get("syntax")
        named = f"{syntax} grammar" if isinstance(syntax, str) else "grammar"
        rules = f"The `input` string is the raw text, in this {named}:\n{definition}"
        return f"{self.description}\n\n{rules}" if self.description else rules


Tool.model_rebuild()


class FunctionChoice(_Body):
    type: Literal["function", "custom"]
    name: str


class OtherChoice(_Body):
    """`allowed_tools`, hosted-tool choices: the model decides, as with `auto`."""

    model_config = ConfigDict(extra="allow")
    type: str


class Reasoning(_Body):
    effort: str | None = Field(None, max_length=32)
    summary: str | None = None


class TextControls(_Body):
    format: TextFormat | None = None
    verbosity: str | None = None


class ResponsesBody(_Body):
    model: str = Field(min_length=1)
    input: str | list[dict[str, Any]] = Field(default_factory=list)
    instructions: str | None = None
    previous_response_id: str | None = Field(None, max_length=64)
    store: bool = True
    stream: bool = False
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | FunctionChoice | OtherChoice | None = None
    parallel_tool_calls: bool = True
    text: TextControls | None = None
    reasoning: Reasoning | None = None
    metadata: dict[str, str] | None = None
    include: list[str] | None = None
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    # Codex names its conversation here; it names the agent when nothing more specific does.
    prompt_cache_key: str | None = Field(None, max_length=256)
    prompt_cache_retention: PromptCacheRetention | None = None
    session_id: str | None = Field(None, pattern=AGENT_ID_PATTERN)

    def logprobs(self) -> int | None:
        """What the request asks of the sampler (`SamplingParams.logprobs`): `top_logprobs`
        alternatives when it includes `message.output_text.logprobs`, else nothing."""
        if "message.output_text.logprobs" not in (self.include or []):
            return None
        return self.top_logprobs or 0

    def tool_count(self) -> int:
        """How many tools the request carries, each inside a namespace counted (`max_tools`)."""
        tools = self.tools or []
        return sum(len(tool.tools or []) if tool.type == "namespace" else 1 for tool in tools)

    def check_tool_names(self) -> None:
        """A function or custom tool without a name is a 400: the model could never call it,
        and the response would echo a tool the SDK's type refuses."""
        for index, tool in enumerate(self.tools or []):
            inner = enumerate(tool.tools or []) if tool.type == "namespace" else ()
            places = [
                (f"tools.{index}", tool),
                *((f"tools.{index}.tools.{i}", t) for i, t in inner),
            ]
            for where, named in places:
                if named.type in ("function", "custom") and named.name is None:
                    raise InvalidRequest(
                        f"{where}.name: a {named.type} tool needs a name", param=f"{where}.name"
                    )

    def offered_tools(self) -> list[tuple[Tool, str | None]]:
        """The tools the model may call, each with its namespace (None outside one)."""
        offered: list[tuple[Tool, str | None]] = []
        for tool in self.tools or []:
            if tool.type == "namespace":
                inner = [t for t in tool.tools or [] if t.offered]
                offered += [(t, tool.name) for t in inner]
            elif tool.offered:
                offered.append((tool, None))
        return offered

    def functions(self) -> list[ToolDefinition]:
        """The offered tools as the function definitions chat templates read."""
        return [tool.as_function() for tool, _ in self.offered_tools()]


def input_items(body: ResponsesBody) -> list[dict[str, Any]]:
    """The input as a list of items (text input is one user message)."""
    if isinstance(body.input, str):
        return [{"type": "message", "role": "user", "content": body.input}]
    return body.input


def item_messages(items: list[dict[str, Any]], seals: Seals | None = None) -> list[dict[str, Any]]:
    """Input items as chat-template messages (Hugging Face conventions): messages by role,
    calls on the assistant turn that made them, each output as a `tool` message, reasoning
    on the assistant turn it preceded. `seals` open reasoning items' `encrypted_content`
    (None: none is opened, each item's own text counts)."""
    rendered: list[dict[str, Any]] = []
    reasoning: list[str] = []
    for index, item in enumerate(items):
        if not isinstance(item, dict):
            raise InvalidRequest(f"input.{index} must be an object", param=f"input.{index}")
        kind = item.get("type", "message")
        if kind == "message":
            _add(rendered, _message(item, index), reasoning)
        elif kind in ("function_call", "custom_tool_call"):
            _add_call(rendered, _call(item, index), reasoning)
        elif kind in ("function_call_output", "custom_tool_call_output"):
            rendered.append(_output(item, index))
        elif kind == "reasoning":
            reasoning.append(reasoning_text(item, seals))
    return rendered


def _add(rendered: list[dict[str, Any]], message: dict[str, Any], reasoning: list[str]) -> None:
    if message["role"] == "assistant" and reasoning:
        message["reasoning_content"] = "".join(reasoning)
        reasoning.clear()
    rendered.append(message)


def _add_call(rendered: list[dict[str, Any]], call: dict[str, Any], reasoning: list[str]) -> None:
    """A call joins the assistant turn before it (its text, its other calls), or opens one."""
    last = rendered[-1] if rendered else None
    if last is None or last["role"] != "assistant":
        last = {"role": "assistant", "content": ""}
        rendered.append(last)
    if reasoning and "reasoning_content" not in last:
        last["reasoning_content"] = "".join(reasoning)
        reasoning.clear()
    last.setdefault("tool_calls", []).append(call)


_ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}


def _message(item: dict[str, Any], index: int) -> dict[str, Any]:
    role = item.get("role")
    if role not in _ROLES:
        raise InvalidRequest(
            f"input.{index}.role must be one of user, assistant, system, developer",
            param=f"input.{index}.role",
        )
    return {"role": _ROLES[role], "content": _content_text(item.get("content"), index)}


_TEXT_PARTS = ("input_text", "output_text", "text", "summary_text", "reasoning_text")


def _content_text(content: Any, index: int, field: str = "content") -> str:
    """The text of item `index`'s `field` (a message's content, a tool's output): a string,
    or text parts."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise InvalidRequest(
            f"input.{index}.{field} must be a string or a list of parts",
            param=f"input.{index}.{field}",
        )
    texts = []
    for part_index, part in enumerate(content):
        where = f"input.{index}.{field}.{part_index}"
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in _TEXT_PARTS and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif kind in ("input_image", "input_file", "input_audio"):
            raise InvalidRequest(
                f"{where}: this model reads text only; {kind} parts are not supported",
                param=where,
            )
        elif kind == "refusal" and isinstance(part.get("refusal"), str):
            texts.append(part["refusal"])
        else:
            raise InvalidRequest(f"{where} is not a text part", param=where)
    return "".join(texts)


def _call(item: dict[str, Any], index: int) -> dict[str, Any]:
    name, call_id = item.get("name"), item.get("call_id")
    if not isinstance(name, str) or not isinstance(call_id, str):
        raise InvalidRequest(
            f"input.{index}: a {item.get('type')} needs a name and a call_id",
            param=f"input.{index}",
        )
    if item.get("type") == "custom_tool_call":
        return template_tool_call(call_id, name, {"input": str(item.get("input", ""))})
    arguments = item.get("arguments")
    if not isinstance(arguments, str):
        raise InvalidRequest(
            f"input.{index}.arguments must be a JSON string", param=f"input.{index}.arguments"
        )
    try:
        parsed = client_json.loads(arguments or "{}")
    except client_json.NotJson as exc:
        raise InvalidRequest(
            f"input.{index}.arguments: the JSON string {exc}", param=f"input.{index}.arguments"
        ) from None
    if not isinstance(parsed, dict):
        raise InvalidRequest(
            f"input.{index}.arguments must encode a JSON object",
            param=f"input.{index}.arguments",
        )
    return template_tool_call(call_id, name, parsed)


def _output(item: dict[str, Any], index: int) -> dict[str, Any]:
    call_id, output = item.get("call_id"), item.get("output")
    if not isinstance(call_id, str):
        raise InvalidRequest(
            f"input.{index}: a tool output needs its call_id", param=f"input.{index}.call_id"
        )
    text = output if isinstance(output, str) else _content_text(output or [], index, "output")
    return {"role": "tool", "tool_call_id": call_id, "content": text}


def reasoning_text(item: dict[str, Any], seals: Seals | None = None) -> str:
    """What a reasoning item says: the text its `encrypted_content` holds when `seals` open it
    (exactly what the model wrote), else its content, else its summary."""
    sealed = None if seals is None else seals.open(item.get("encrypted_content"))
    if sealed is not None:
        return sealed
    for field in ("content", "summary"):
        parts = item.get(field)
        if isinstance(parts, list):
            texts = [
                p["text"] for p in parts if isinstance(p, dict) and isinstance(p.get("text"), str)
            ]
            if texts:
                return "".join(texts)
    return ""
