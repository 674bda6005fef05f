"""OpenAI Chat Completions and Models: body → `Request` → engine events → JSON or SSE chunks.

Translation only (PROTOCOLS.md §3): no engine state, no SSE bytes (those live in streaming.py).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any, Literal

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field

from semantic.api import anthropic
from semantic.api.agents import named_agent
from semantic.api.errors import error_payload, protocol_of
from semantic.api.streaming import (
    DONE,
    after_the_200,
    data_event,
    sse_response,
    unless_disconnected,
    whole_answer,
    with_keep_alive,
)
from semantic.core import AGENT_ID_PATTERN, FinishReason, SamplingParams, TokenEvent, Usage
from semantic.core import Request as GenerationRequest
from semantic.engine.engine import Engine
from semantic.errors import ContextOverflow, InvalidRequest
from semantic.models.served import ServedModel
from semantic.text.chat import template_tool_call

router = APIRouter()

KEEP_ALIVE_S = 5.0


class _Body(BaseModel):
    # Accept generously (unknown fields are ignored), but no silent type coercion.
    model_config = ConfigDict(extra="ignore", strict=True)


class ContentPart(_Body):
    type: str
    text: str | None = None


class FunctionCall(_Body):
    name: str
    arguments: str


class ToolCall(_Body):
    id: str | None = None
    type: str = "function"
    function: FunctionCall


class ChatMessage(_Body):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None


class StreamOptions(_Body):
    include_usage: bool = False


class ChatCompletionRequest(_Body):
    model: str
    messages: list[ChatMessage] = Field(min_length=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0, le=2)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(0, ge=-1)
    seed: int | None = None
    stop: str | list[str] | None = None
    n: int = Field(1, ge=1)
    tools: list[dict[str, Any]] | None = None
    # Extensions that benchmarks and agent clients rely on (vLLM spells them the same way).
    ignore_eos: bool = False
    min_tokens: int = Field(0, ge=0)
    session_id: str | None = Field(None, pattern=AGENT_ID_PATTERN)


def _text_of(message: ChatMessage) -> str:
    if message.content is None or isinstance(message.content, str):
        return message.content or ""
    parts = []
    for part in message.content:
        if part.type != "text" or part.text is None:
            raise InvalidRequest(
                f"content parts of type {part.type!r} are not supported", param="messages"
            )
        parts.append(part.text)
    return "\n".join(parts)


def template_messages(messages: list[ChatMessage]) -> list[dict[str, Any]]:
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
        rendered.append(entry)
    return rendered


def _template_tool_call(call: ToolCall) -> dict[str, Any]:
    try:
        arguments = json.loads(call.function.arguments)
    except json.JSONDecodeError as exc:
        raise InvalidRequest("tool_calls arguments must be a JSON string", "messages") from exc
    return template_tool_call(call.id, call.function.name, arguments)


def sampling_params(body: ChatCompletionRequest, max_tokens: int) -> SamplingParams:
    stops = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
    if len(stops) > 16 or any(not stop for stop in stops):
        raise InvalidRequest("stop takes at most 16 non-empty strings", param="stop")
    return SamplingParams(
        temperature=body.temperature,
        top_p=body.top_p,
        top_k=max(body.top_k, 0),
        seed=body.seed,
        max_tokens=max_tokens,
        min_tokens=body.min_tokens,
        stop=tuple(stops),
        ignore_eos=body.ignore_eos,
    )


def render_prompt(model: ServedModel, body: ChatCompletionRequest) -> list[int]:
    """The prompt's token ids: templated, then tokenized (on a worker thread: a long prompt
    must not stall the event loop)."""
    prompt = model.chat_template.render(template_messages(body.messages), tools=body.tools)
    return model.tokenizer.encode(prompt)


def output_budget(requested: int | None, prompt_tokens: int, context: int, default: int) -> int:
    """max_tokens for a request: what it asked for if that fits the context, else an error;
    with none asked, the default capped by the room left."""
    room = context - prompt_tokens
    if room < 1:
        raise ContextOverflow(prompt_tokens, requested or 0, context)
    if requested is None:
        return min(default, room)
    if requested > room:
        raise ContextOverflow(prompt_tokens, requested, context)
    return requested


def usage_json(usage: Usage) -> dict[str, Any]:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
    }


def finish_reason_json(reason: FinishReason | None) -> str:
    return "length" if reason is FinishReason.LENGTH else "stop"


@router.post("/v1/chat/completions")
async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
    engine: Engine = request.app.state.engine
    if body.n != 1:
        raise InvalidRequest("only n=1 is supported", param="n")
    prompt_ids = await asyncio.to_thread(render_prompt, engine.model, body)
    requested = body.max_completion_tokens or body.max_tokens
    max_tokens = output_budget(
        requested,
        len(prompt_ids),
        engine.max_seq_tokens,
        request.app.state.settings.default_max_tokens,
    )
    agent_id = named_agent(request.headers, body.session_id, param="session_id")
    generation = GenerationRequest(
        request_id=request.state.request_id,
        prompt_token_ids=prompt_ids,
        sampling=sampling_params(body, max_tokens),
        agent_id=agent_id,
    )
    events = engine.stream(generation)
    completion = _Completion(f"chatcmpl-{uuid.uuid4().hex}", int(time.time()), body.model)
    if body.stream:
        include_usage = body.stream_options is not None and body.stream_options.include_usage
        chunks = completion.chunks(events, include_usage)
        frames = after_the_200(chunks, events, lambda exc: data_event(error_payload(exc)))
        return sse_response(with_keep_alive(frames, KEEP_ALIVE_S))
    return JSONResponse(await unless_disconnected(request, completion.collect(events)))


class _Completion:
    """One response's identity, shared by its chunks or its single JSON body."""

    def __init__(self, completion_id: str, created: int, model: str) -> None:
        self.id, self.created, self.model = completion_id, created, model

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
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        return data_event(self._chunk([choice]))

    async def chunks(
        self, events: AsyncIterator[TokenEvent], include_usage: bool
    ) -> AsyncIterator[str]:
        yield self._delta({"role": "assistant", "content": ""})
        async for event in events:
            if event.error is not None:
                yield data_event(error_payload(event.error))
                return
            if event.text:
                yield self._delta({"content": event.text})
            if event.finish_reason is not None:
                yield self._delta({}, finish_reason_json(event.finish_reason))
                if include_usage and event.usage is not None:
                    yield data_event(self._chunk([], usage=usage_json(event.usage)))
        yield DONE

    async def collect(self, events: AsyncIterator[TokenEvent]) -> dict[str, Any]:
        text, final = await whole_answer(events)
        assert final.usage is not None
        return {
            "id": self.id,
            "object": "chat.completion",
            "created": self.created,
            "model": self.model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text, "refusal": None},
                    "logprobs": None,
                    "finish_reason": finish_reason_json(final.finish_reason),
                }
            ],
            "usage": usage_json(final.usage),
        }


# Both APIs list models here; a client speaking Anthropic gets Anthropic's shapes.


@router.get("/v1/models")
async def list_models(request: Request) -> dict[str, Any]:
    if protocol_of(request) == "anthropic":
        return anthropic.model_list(request)
    return {"object": "list", "data": [_model_card(request)]}


@router.get("/v1/models/{model_id:path}")
async def get_model(model_id: str, request: Request) -> dict[str, Any]:
    if protocol_of(request) == "anthropic":
        return anthropic.model_card(request, model_id)
    return _model_card(request) | {"id": model_id}


def _model_card(request: Request) -> dict[str, Any]:
    engine: Engine = request.app.state.engine
    return {
        "id": engine.model.name,
        "object": "model",
        "created": int(request.app.state.started_at),
        "owned_by": "semantic",
        "max_model_len": engine.max_seq_tokens,
    }
