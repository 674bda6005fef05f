"""OpenAI Chat Completions (`/v1/chat/completions`), one dialect of the chat pipeline: the body
parsed into a `ChatRequest`, the pipeline's events rendered back as JSON or SSE chunks.

Translation only: no engine state, no SSE bytes (those live in streaming.py). What it shares
with the legacy Completions is in `openai_fields.py`; the legacy API itself, `completions.py`.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Mapping
from functools import partial
from typing import Any, Literal

from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import ConfigDict, Field

from semantic.api import pipeline
from semantic.api.limits import OutputBudget
from semantic.api.logprobs import MAX_TOP_LOGPROBS, Trail, chat_logprobs, requires_logprobs
from semantic.api.openai_fields import (
    GENERATION_RESPONSES,
    GenerationFields,
    OpenAIBody,
    error_chunk,
    finish_reason_json,
    sampling_of,
)
from semantic.api.openai_tools import (
    CHOICE_NEEDS_TOOLS,
    ToolChoiceField,
    ToolDefinition,
    template_tools,
    tool_call_delta,
    tool_calls_json,
    tool_use_of,
)
from semantic.api.pipeline import ChatRequest, Sampling, render_messages
from semantic.api.prompt_bounds import PromptRoute
from semantic.api.prompt_cache import PromptCacheRetention, prompt_cache_agent, retention_of
from semantic.api.streaming import DONE, data_event, prefill_comments
from semantic.api.structured_output import ResponseFormat
from semantic.api.thinking import Thinking
from semantic.api.tool_use import Reasoning, ReasoningDelta, ReplyEvent, ToolUse, whole_reply
from semantic.api.usage import chat_usage
from semantic.core import TokenEvent, TokenLogprob
from semantic.errors import InvalidRequest
from semantic.models.served import ServedModel
from semantic.settings.settings import Settings
from semantic.text import client_json
from semantic.text.chat import template_tool_call
from semantic.text.reasoning import ThinkingSwitch
from semantic.text.tools import TextDelta

router = APIRouter(route_class=PromptRoute)


class ContentPart(OpenAIBody):
    type: str
    text: str | None = None


class FunctionCall(OpenAIBody):
    name: str
    arguments: str


class ToolCall(OpenAIBody):
    id: str | None = None
    type: str = "function"
    function: FunctionCall


class ChatMessage(OpenAIBody):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    # A thinking model's reasoning, sent back (vLLM's and llama.cpp's name, and the older one).
    reasoning_content: str | None = None
    reasoning: str | None = None


class ChatCompletionRequest(GenerationFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    tools: list[ToolDefinition] | None = None
    tool_choice: ToolChoiceField | None = None
    parallel_tool_calls: bool = True
    response_format: ResponseFormat | None = None
    reasoning_effort: str | None = Field(None, max_length=32)
    # The conversation, named as in Responses (api/prompt_cache.py).
    prompt_cache_key: str | None = Field(None, max_length=256)
    prompt_cache_retention: PromptCacheRetention | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)

    # What a field's type cannot say, said in the schema too (the server checks it by hand).
    model_config = ConfigDict(
        json_schema_extra={"allOf": [requires_logprobs("top_logprobs"), CHOICE_NEEDS_TOOLS]}
    )


def _text_of(message: ChatMessage) -> str:
    if message.content is None or isinstance(message.content, str):
        return message.content or ""
    parts = []
    for part in message.content:
        if part.type != "text" or part.text is None:
            raise InvalidRequest(
                f"content parts of type {part.type!r} are not supported: this model reads "
                "text only",
                param="messages",
            )
        parts.append(part.text)
    return "\n".join(parts)


def chat_messages(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    """OpenAI messages as chat templates expect them (Hugging Face conventions)."""
    rendered = []
    for message in messages:
        entry: dict[str, Any] = {
            "role": "system" if message.role == "developer" else message.role,
            "content": _text_of(message),
        }
        if message.tool_calls:
            entry["tool_calls"] = [_template_tool_call(call) for call in message.tool_calls]
        if message.tool_call_id is not None:
            entry["tool_call_id"] = message.tool_call_id
        reasoning = message.reasoning_content or message.reasoning
        if message.role == "assistant" and reasoning:
            entry["reasoning_content"] = reasoning
        rendered.append(entry)
    return rendered


def _template_tool_call(call: ToolCall) -> dict[str, Any]:
    try:
        arguments = client_json.loads(call.function.arguments)
    except client_json.NotJson as exc:
        raise InvalidRequest(f"tool_calls arguments: the JSON string {exc}", "messages") from None
    return template_tool_call(call.id, call.function.name, arguments)


@router.post("/v1/chat/completions", responses=GENERATION_RESPONSES)
async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
    if body.n != 1:
        raise InvalidRequest("only n=1 is supported", param="n")
    agent = prompt_cache_agent(request.headers, body.session_id, body.prompt_cache_key)
    sampling = sampling_of(body)
    engine = pipeline.admit(
        request, body.model, len(body.messages), len(body.tools or []), sampling, agent
    )
    chat = chat_request(body, engine.model, request.app.state.settings, sampling, agent)
    reply = await pipeline.start(request, engine, chat)
    completion = _Completion(
        f"chatcmpl-{uuid.uuid4().hex}", int(time.time()), body.model, reply.trail
    )
    return await reply.submitted.respond(
        request,
        body.stream,
        partial(completion.chunks, reply.parsed, chat.tools, body.include_usage),
        partial(completion.collect, reply.parsed, chat.tools),
        error_chunk,
        prefill_comments(reply.submitted.progress),
    )


def chat_request(
    body: ChatCompletionRequest,
    model: ServedModel,
    settings: Settings,
    sampling: Sampling,
    agent: str | None,
) -> ChatRequest:
    """The body as the chat pipeline reads it."""
    logprobs = chat_logprobs(body.logprobs, body.top_logprobs)
    param = "max_completion_tokens" if body.max_completion_tokens else "max_tokens"
    requested = body.max_completion_tokens or body.max_tokens
    retention, max_ttl_s = body.prompt_cache_retention, settings.max_retention_ttl_s
    return ChatRequest(
        tools=tool_use_of(model, body.tools, body.tool_choice, body.parallel_tool_calls),
        thinking=Thinking.of(model, ThinkingSwitch.from_effort(body.reasoning_effort)),
        render=partial(_prompt, model, body),
        budget=OutputBudget(requested, settings.default_max_tokens, param=param),
        sampling=sampling,
        output=body.response_format.output_format() if body.response_format else None,
        agent=agent,
        logprobs=logprobs,
        breakpoints=partial(retention_of, retention, max_ttl_s=max_ttl_s),
    )


def _prompt(
    model: ServedModel,
    body: ChatCompletionRequest,
    reply_start: str = "",
    template_vars: Mapping[str, Any] | None = None,
) -> list[int]:
    """The prompt's token ids (`ChatRequest.render`), the messages translated on the worker
    thread that renders them: a long history's tool-call arguments are parsed there too."""
    messages, tools = chat_messages(body.messages), template_tools(body.tools)
    return render_messages(model, messages, tools, reply_start, template_vars)


class _Completion:
    """One response's identity, shared by its chunks or its single JSON body, and the log
    probabilities of its tokens (`trail`): each chunk carries those that came since the last
    one, the JSON body all of them."""

    def __init__(self, completion_id: str, created: int, model: str, trail: Trail) -> None:
        self.id, self.created, self.model = completion_id, created, model
        self.trail = trail

    def _chunk(self, choices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": choices,
            **extra,
        }

    def _delta(self, delta: dict[str, Any], finish_reason: str | None = None) -> str:
        new = self.trail.take()
        logprobs = self._logprobs(new) if new else None
        choice = {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}
        return data_event(self._chunk([choice]))

    def _logprobs(self, logprobs: list[TokenLogprob]) -> dict[str, Any] | None:
        if not self.trail.asked:
            return None
        return {"content": self.trail.entries(logprobs), "refusal": None}

    async def chunks(
        self,
        parsed: AsyncIterator[tuple[list[ReplyEvent], TokenEvent]],
        tools: ToolUse,
        include_usage: bool,
    ) -> AsyncIterator[str]:
        yield self._delta({"role": "assistant", "content": ""})
        async for tool_events, event in parsed:
            if event.error is not None:
                yield error_chunk(event.error)
                return
            for tool_event in tool_events:
                if isinstance(tool_event, ReasoningDelta):
                    yield self._delta({"reasoning_content": tool_event.text})
                elif isinstance(tool_event, TextDelta):
                    yield self._delta({"content": tool_event.text})
                elif (delta := tool_call_delta(tool_event)) is not None:
                    yield self._delta(delta)
            if event.finish_reason is not None:
                yield self._delta({}, _finish_reason(event, tools))
                if include_usage and event.usage is not None:
                    yield data_event(self._chunk([], usage=chat_usage(event.usage)))
        yield DONE

    async def collect(
        self, parsed: AsyncIterator[tuple[list[ReplyEvent], TokenEvent]], tools: ToolUse
    ) -> dict[str, Any]:
        parts, final = await whole_reply(parsed)
        assert final.usage is not None
        text = "".join(part for part in parts if isinstance(part, str))
        message: dict[str, Any] = {"role": "assistant", "content": text, "refusal": None}
        if calls := tool_calls_json(parts):
            message |= {"content": text or None, "tool_calls": calls}
        reasoning = "".join(part.text for part in parts if isinstance(part, Reasoning))
        if reasoning:
            message["reasoning_content"] = reasoning
        return {
            "id": self.id,
            "object": "chat.completion",
            "created": self.created,
            "model": self.model,
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "logprobs": self._logprobs(self.trail.all),
                    "finish_reason": _finish_reason(final, tools),
                }
            ],
            "usage": chat_usage(final.usage),
        }


def _finish_reason(final: TokenEvent, tools: ToolUse) -> str:
    return "tool_calls" if tools.called(final) else finish_reason_json(final.finish_reason)
