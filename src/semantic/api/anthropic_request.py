"""The Anthropic Messages request: its body, read and checked, and the prompt it stands for.

Accepts generously: unknown fields and block types pass, roles other
than `assistant` count as `user` (but see below); thinking blocks become the reasoning of their
assistant turn (their seal, when this server made it for this caller, holds the very text the
model wrote: api/seal.py). An image is
refused: the model reads text only, and a client must know its image was not seen. Claude
Code's per-request churn is stripped here, through text/claude_code.py, before templating, so a
session keeps its cached prefix from turn to turn.

A Claude Code session's system context is laid out so that a new session starts warm
(`_system_context`): what every session shares first, the session's own sections last; its
git status is the one its first request sent, when the caller passes that in (a later process
takes a new one: api/git_snapshots.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag

from semantic.api import tool_use
from semantic.api.seal import Seals
from semantic.api.structured_output import AnthropicFormat, OutputFormat
from semantic.errors import InvalidRequest
from semantic.models.served import ServedModel
from semantic.text import claude_code
from semantic.text.chat import template_tool_call

DOCUMENT_TEXT = "[document]"  # what a text-only model sees of a PDF
PART_SEPARATOR = "\n\n"  # between the text blocks of one turn, and merged turns


class _Body(BaseModel):
    # Accept generously (unknown fields are ignored), but no silent type coercion.
    model_config = ConfigDict(extra="ignore", strict=True, allow_inf_nan=False)


class CacheControl(_Body):
    """A cache breakpoint: the prompt up to and including its block will be sent again
    (api/breakpoints.py)."""

    type: Literal["ephemeral"]
    ttl: Literal["5m", "1h"] | None = None


class TextBlock(_Body):
    type: Literal["text"]
    text: str
    cache_control: CacheControl | None = None


class ToolUseBlock(_Body):
    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any]
    cache_control: CacheControl | None = None


class ToolResultBlock(_Body):
    type: Literal["tool_result"]
    tool_use_id: str
    content: str | list[ContentBlock] | None = None
    is_error: bool | None = None
    cache_control: CacheControl | None = None


class OtherBlock(_Body):
    """Any other block (image, document, thinking, server tools, types not invented yet):
    accepted as sent and read loosely."""

    model_config = ConfigDict(extra="allow")
    type: str


def _block_kind(value: Any) -> str:
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    return f"{kind} block" if kind in ("text", "tool_use", "tool_result") else "other block"


# Tag names hold a space so that error messages can leave them out of field paths.
ContentBlock = Annotated[
    Annotated[TextBlock, Tag("text block")]
    | Annotated[ToolUseBlock, Tag("tool_use block")]
    | Annotated[ToolResultBlock, Tag("tool_result block")]
    | Annotated[OtherBlock, Tag("other block")],
    Discriminator(_block_kind),
]
ToolResultBlock.model_rebuild()


class Message(_Body):
    role: str  # user, assistant; system and anything else count as user
    content: str | list[ContentBlock]


# A server tool's type: a versioned name, never "custom" (a client's own tool) nor null.
_SERVER_TOOL_TYPE: dict[str, Any] = {"type": "string", "not": {"const": "custom"}}
# A tool the model may call: one with a schema.
_WITH_SCHEMA: dict[str, Any] = {
    "required": ["input_schema"],
    "properties": {"input_schema": {"type": "object"}},
}


class Tool(_Body):
    # A client's own tool (no type, or "custom") needs its schema (`tool_use_of`).
    model_config = ConfigDict(
        json_schema_extra={
            "anyOf": [
                _WITH_SCHEMA,
                {"required": ["type"], "properties": {"type": _SERVER_TOOL_TYPE}},
            ]
        }
    )

    name: str
    type: str | None = None  # none or "custom" for a client's tool; versioned for server tools
    description: str | None = None
    input_schema: dict[str, Any] | None = None  # absent on server tools (`type: web_search_…`)
    strict: bool | None = None  # a forced call's input must match input_schema
    cache_control: CacheControl | None = None

    @property
    def is_custom(self) -> bool:
        """A tool the client runs (the model may call it); server tools have a versioned
        type and no schema, and are not offered to a local model."""
        return self.type in (None, "custom")


class ToolChoiceParam(_Body):
    """Anthropic's `tool_choice` as sent (api/tool_use.py: `ToolChoice` is what it means)."""

    # `type: tool` names its tool (one of `tools`: `_tool_choice`).
    model_config = ConfigDict(
        json_schema_extra={
            "if": {"properties": {"type": {"const": "tool"}}, "required": ["type"]},
            "then": {"required": ["name"], "properties": {"name": {"type": "string"}}},
        }
    )

    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class ThinkingConfigParam(_Body):
    """Anthropic's `thinking` as sent (api/thinking.py: `Thinking` is what it means)."""

    type: str  # enabled, disabled, adaptive; others (between_tools, newer ones) count as off
    budget_tokens: int | None = Field(None, ge=0)
    display: Literal["summarized", "omitted"] | None = None


class OutputConfig(_Body):
    effort: str | None = Field(None, max_length=32)
    format: AnthropicFormat | None = None


class Metadata(_Body):
    user_id: str | None = Field(None, max_length=256)


class PromptBody(_Body):
    """What decides the prompt: all of /v1/messages/count_tokens, the start of /v1/messages."""

    # A `tool_choice` that asks for a call needs tools (`_tool_choice`), in the schema too.
    model_config = ConfigDict(
        json_schema_extra={
            "if": {
                "properties": {"tool_choice": {"properties": {"type": {"enum": ["any", "tool"]}}}},
                "required": ["tool_choice"],
            },
            "then": {
                "required": ["tools"],
                "properties": {"tools": {"type": "array", "contains": _WITH_SCHEMA}},
            },
        }
    )

    model: str = Field(min_length=1)
    messages: list[Message] = Field(min_length=1)  # at most `max_messages` (api/limits.py)
    system: str | list[ContentBlock] | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoiceParam | None = None
    thinking: ThinkingConfigParam | None = None
    output_config: OutputConfig | None = None
    output_format: AnthropicFormat | None = None  # the structured-outputs beta's spelling

    def output(self) -> OutputFormat | None:
        """The answer's format: `output_config.format`, else the beta's `output_format`."""
        if self.output_config is not None and self.output_config.format is not None:
            return self.output_config.format.output_format("output_config.format")
        if self.output_format is not None:
            return self.output_format.output_format("output_format")
        return None


class MessagesBody(PromptBody):
    max_tokens: int = Field(ge=0)  # 0: prefill (and cache) the prompt, generate nothing
    stream: bool = False
    # An empty stop sequence would end every answer before its first token. How many, and
    # how long: api/limits.py.
    stop_sequences: list[Annotated[str, Field(min_length=1)]] | None = None
    temperature: float | None = Field(None, ge=0, le=1)
    top_p: float | None = Field(None, ge=0, le=1)
    top_k: int | None = Field(None, ge=0)
    metadata: Metadata | None = None
    cache_control: CacheControl | None = None  # automatic: a breakpoint at the last block


# -- the prompt ----------------------------------------------------------------------------


def refuse_images(body: PromptBody) -> None:
    """A 400 naming the first image block, anywhere (a tool result's too): the model would not
    see it."""
    blocks: list[tuple[str, Any]] = []
    if isinstance(body.system, list):
        blocks += [(f"system.{i}", block) for i, block in enumerate(body.system)]
    for m, message in enumerate(body.messages):
        if isinstance(message.content, list):
            blocks += [(f"messages.{m}.content.{i}", b) for i, b in enumerate(message.content)]
    while blocks:
        where, block = blocks.pop(0)
        if isinstance(block, OtherBlock) and block.type == "image":
            raise InvalidRequest(
                f"{where}: this model reads text only; it cannot see an image block",
                param="messages",
            )
        if isinstance(block, ToolResultBlock) and isinstance(block.content, list):
            blocks += [(f"{where}.content.{i}", b) for i, b in enumerate(block.content)]


def template_messages(
    body: PromptBody,
    later_system_turns: bool = False,
    seals: Seals | None = None,
    git_status: str | None = None,
) -> list[dict[str, Any]]:
    """The conversation as chat templates expect it (Hugging Face conventions): the system
    context (one system message, or several: `_system_context`), user and assistant turns
    (consecutive ones merged, as the API does), tool calls on assistant turns and tool results
    as `tool` messages, thinking as the reasoning of its assistant turn. Claude Code's churn is
    stripped from everything but the model's own words. `later_system_turns`: the template
    gives a system message after the first a turn of its own. `seals` open the thinking
    blocks' signatures (None: none is opened, each block's own text counts). `git_status`
    stands for the system prompt's `gitStatus:` section, when it has one (the session's first
    snapshot: api/git_snapshots.py)."""
    system = claude_code.clean_system(_system_texts(body.system))
    if git_status is not None:
        system = claude_code.with_git_status(system, git_status)
    head, messages = _system_context(system, body.messages, later_system_turns)
    rendered: list[dict[str, Any]] = [{"role": "system", "content": text} for text in head]
    for message in messages:
        role = "assistant" if message.role == "assistant" else "user"
        blocks = message.content if isinstance(message.content, list) else [message.content]
        for entry in _entries(role, blocks, seals):
            _append(rendered, entry)
    return rendered


def _system_context(
    blocks: list[str], messages: list[Message], later_system_turns: bool
) -> tuple[list[str], list[Message]]:
    """The system messages the prompt starts with, and the messages that follow them.

    Claude Code's system prompt holds sections that are its session's own (memory folder,
    working folder, git status: claude_code.split_session), ~440 tokens in, before the ~17K
    tokens of instructions and tools that every session shares. When the template gives later
    system messages turns of their own, the prompt starts instead with the rest of the system
    prompt (and the tools, which templates such as Qwen's put after it), then the system
    messages sent before the first assistant turn (the Agent tool's agent types, shared too),
    and only then the session's sections, as one more system turn. The model is told the same
    words, all as system context; only their order changes, so that a new session's first
    request reuses the ~18K tokens any earlier session cached. (Before, those early system
    messages were merged into the first user turn, after the user's words.) A template that
    refuses or drops a later system message keeps the system prompt whole, as sent.

    Its one-line identity block goes first, alone, so that the tools follow it: a subagent's
    instructions are its agent type's, but its identity line and most of its tools are the
    session's (claude_code.split_identity)."""
    system = PART_SEPARATOR.join(blocks)
    identity, instructions = claude_code.split_identity(blocks)
    shared, own = claude_code.split_session(PART_SEPARATOR.join(instructions))
    if not (own and later_system_turns):
        return ([system] if system else []), messages
    early = _before_first_answer(messages)
    early_texts = [text for message in early if (text := _system_message_text(message))]
    rest = [message for message in messages if all(message is not e for e in early)]
    return [text for text in (identity, shared, *early_texts, own) if text], rest


def _before_first_answer(messages: list[Message]) -> list[Message]:
    """The system messages sent before the first assistant turn: context for the whole
    conversation, the same in every request of a session."""
    answered = next((i for i, m in enumerate(messages) if m.role == "assistant"), len(messages))
    return [message for message in messages[:answered] if message.role == "system"]


def _system_message_text(message: Message) -> str:
    blocks = message.content if isinstance(message.content, list) else [message.content]
    texts = (claude_code.strip_countdowns(text) for b in blocks if (text := _text_of(b)))
    return PART_SEPARATOR.join(text for text in texts if text)


def git_status_of(body: PromptBody) -> str | None:
    """The `gitStatus:` section of the request's system prompt, as it is templated."""
    return claude_code.git_status(claude_code.clean_system(_system_texts(body.system)))


def _system_texts(system: str | list[ContentBlock] | None) -> list[str]:
    if system is None:
        return []
    blocks = [system] if isinstance(system, str) else system
    return [text for block in blocks if (text := _text_of(block)) is not None]


def _entries(
    role: str, blocks: Sequence[str | ContentBlock], seals: Seals | None = None
) -> list[dict[str, Any]]:
    """One message's blocks as template messages: its text (and tool calls) as one turn, each
    tool result as a `tool` message, in the order they came."""
    entries: list[dict[str, Any]] = []
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    thoughts: list[str] = []

    def flush() -> None:
        if texts or calls or thoughts:
            entry: dict[str, Any] = {"role": role, "content": PART_SEPARATOR.join(texts)}
            entry |= {"tool_calls": list(calls)} if calls else {}
            entries.append(entry | ({"reasoning_content": "".join(thoughts)} if thoughts else {}))
        texts.clear()
        calls.clear()
        thoughts.clear()

    for block in blocks:
        if role == "assistant" and isinstance(block, OtherBlock) and block.type == "thinking":
            thoughts.append(thinking_text(block.model_extra or {}, seals))
        elif isinstance(block, ToolUseBlock):
            calls.append(template_tool_call(block.id, block.name, block.input))
        elif isinstance(block, ToolResultBlock):
            flush()
            entries.append(template_tool_result(block))
        elif (text := _text_of(block)) is not None:
            # The model's own words stay as they were sampled: they are its cached history.
            text = text if role == "assistant" else claude_code.strip_countdowns(text)
            if text:
                texts.append(text)
    flush()
    return entries


def _append(rendered: list[dict[str, Any]], entry: dict[str, Any]) -> None:
    """Merge consecutive user (or assistant) turns into one, as the API does; templates that
    insist on alternating roles accept the result."""
    last = rendered[-1] if rendered else None
    if last is None or entry["role"] == "tool" or last["role"] != entry["role"]:
        rendered.append(entry)
        return
    last["content"] = PART_SEPARATOR.join(t for t in (last["content"], entry["content"]) if t)
    if "tool_calls" in entry:
        last["tool_calls"] = [*last.get("tool_calls", []), *entry["tool_calls"]]


def _text_of(block: str | ContentBlock) -> str | None:
    """What a text-only model reads of a block; None for blocks it does not read (thinking,
    server tool traffic, unknown types)."""
    if isinstance(block, str):
        return block
    if isinstance(block, TextBlock):
        return block.text
    if isinstance(block, ToolResultBlock):
        return _result_text(block)
    if isinstance(block, OtherBlock):
        return _other_text(block.type, block.model_extra or {})
    return None


def thinking_text(fields: Mapping[str, Any], seals: Seals | None = None) -> str:
    """What a thinking block sent back says: the text its seal holds (when `seals` open it:
    exactly what the model wrote and the client was shown), else its `thinking`."""
    sealed = None if seals is None else seals.open(fields.get("signature"))
    if sealed is not None:
        return sealed
    thinking = fields.get("thinking")
    return thinking if isinstance(thinking, str) else ""


def _other_text(kind: str, fields: Mapping[str, Any]) -> str | None:
    if kind == "document":
        source = fields.get("source")
        text = source.get("data") if isinstance(source, dict) else None
        is_text = isinstance(source, dict) and source.get("type") == "text"
        return text if is_text and isinstance(text, str) else DOCUMENT_TEXT
    if kind in ("search_result", "mid_conv_system"):
        parts = [fields.get("title"), *_texts_in(fields.get("content"))]
        return PART_SEPARATOR.join(p for p in parts if isinstance(p, str) and p) or None
    return None


def _texts_in(content: Any) -> list[str]:
    blocks = content if isinstance(content, list) else []
    return [b["text"] for b in blocks if isinstance(b, dict) and isinstance(b.get("text"), str)]


def _result_text(result: ToolResultBlock) -> str:
    """A tool result's content as text (images become a placeholder)."""
    content = result.content
    if content is None or isinstance(content, str):
        return claude_code.strip_countdowns(content or "")
    texts = (_text_of(block) for block in content)
    return PART_SEPARATOR.join(
        cleaned for text in texts if text and (cleaned := claude_code.strip_countdowns(text))
    )


# Tools: how tool definitions, calls and results reach the chat template (the shapes the
# OpenAI route hands it too), and which calls the model may make.


def template_tools(tools: list[Tool] | None) -> list[dict[str, Any]] | None:
    """Custom tools in the function shape chat templates read; server tools, which have no
    schema, are left out. A description names the model as every turn of a Claude Code session
    does (claude_code.strip_long_context)."""
    functions = [
        {
            "type": "function",
            "function": {
                "name": tool.name,
                "description": claude_code.strip_long_context(tool.description or ""),
                "parameters": tool.input_schema,
            },
        }
        for tool in tools or []
        if tool.input_schema is not None
    ]
    return functions or None


def tool_use_of(model: ServedModel, body: PromptBody) -> tool_use.ToolUse:
    """The tools the model may call and how (`tool_choice`), checked as the real API checks
    them: unique names, a schema on every custom tool, a named choice that names one of them."""
    tools = body.tools or []
    names = [tool.name for tool in tools]
    if len(set(names)) < len(names):
        raise InvalidRequest("tools: tool names must be unique", param="tools")
    for index, tool in enumerate(tools):
        if tool.is_custom and tool.input_schema is None:
            raise InvalidRequest(f"tools.{index}.input_schema: Field required", param="tools")
    schemas = {tool.name: tool.input_schema for tool in tools if tool.input_schema is not None}
    choice = _tool_choice(body.tool_choice, list(schemas))
    strict = [tool.name for tool in tools if tool.strict]
    return tool_use.ToolUse(model, list(schemas), choice, schemas, strict)


def _tool_choice(choice: ToolChoiceParam | None, names: list[str]) -> tool_use.ToolChoice:
    if choice is None:
        return tool_use.ToolChoice()
    parallel = not choice.disable_parallel_tool_use
    if choice.type in ("any", "tool") and not names:
        raise InvalidRequest(
            f"tool_choice: type {choice.type!r} needs tools to choose from", param="tool_choice"
        )
    if choice.type == "tool" and choice.name not in names:
        named = "no tool" if choice.name is None else f"the tool {choice.name!r}"
        raise InvalidRequest(
            f"tool_choice: names {named}, which is not in tools", param="tool_choice"
        )
    if choice.type == "none":
        return tool_use.ToolChoice("none", parallel=parallel)
    mode: Literal["auto", "required"] = "auto" if choice.type == "auto" else "required"
    return tool_use.ToolChoice(mode, choice.name if choice.type == "tool" else None, parallel)


def template_tool_result(block: ToolResultBlock) -> dict[str, Any]:
    result = {"role": "tool", "tool_call_id": block.tool_use_id, "content": _result_text(block)}
    return result | {"is_error": True} if block.is_error else result


def render_prompt(
    model: ServedModel,
    body: PromptBody,
    reply_start: str = "",
    template_vars: Mapping[str, Any] | None = None,
    *,
    seals: Seals | None = None,
    git_status: str | None = None,
) -> list[int]:
    """The prompt's token ids: what /v1/messages prefills and /v1/messages/count_tokens counts
    (`render_text`, tokenized)."""
    text = render_text(model, body, reply_start, template_vars, seals=seals, git_status=git_status)
    return model.tokenizer.encode(text)


def render_text(
    model: ServedModel,
    body: PromptBody,
    reply_start: str = "",
    template_vars: Mapping[str, Any] | None = None,
    *,
    seals: Seals | None = None,
    git_status: str | None = None,
) -> str:
    """The prompt's text. A last assistant turn is continued (prefill), not closed;
    `reply_start` (a forced tool call's opener) follows it. `template_vars` are the template's
    switches (thinking); `seals` open the thinking blocks' signatures; `git_status` stands for
    the system prompt's own."""
    later_system_turns = model.chat_template.later_system_turns
    messages = template_messages(body, later_system_turns, seals, git_status)
    prefilled = bool(messages) and messages[-1]["role"] == "assistant"
    text = model.chat_template.render(
        messages,
        tools=template_tools(body.tools),
        continue_final_message=prefilled,
        **(template_vars or {}),
    )
    return text + reply_start
