"""OpenAI Chat Completions, legacy Completions and Models: body → `Request` → engine events →
JSON or SSE chunks.

Translation only: no engine state, no SSE bytes (those live in streaming.py).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Mapping
from functools import partial
from typing import Annotated, Any, Literal, cast

from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema

from semantic.api import pipeline
from semantic.api.agents import named_agent
from semantic.api.errors import error_payload
from semantic.api.limits import OutputBudget
from semantic.api.logprobs import (
    MAX_LEGACY_LOGPROBS,
    MAX_TOP_LOGPROBS,
    Trail,
    chat_logprobs,
    legacy_json,
    requires_logprobs,
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
from semantic.api.openapi import STREAMED_OR_JSON, error_responses
from semantic.api.pipeline import ChatRequest, Sampling, render_messages
from semantic.api.prompt_bounds import PromptRoute
from semantic.api.prompt_cache import PromptCacheRetention, prompt_cache_agent, retention_of
from semantic.api.streaming import (
    DONE,
    KEEP_ALIVE,
    data_event,
    prefill_comments,
    whole_answer,
)
from semantic.api.structured_output import ResponseFormat
from semantic.api.thinking import Thinking
from semantic.api.tool_use import Reasoning, ReasoningDelta, ReplyEvent, ToolUse, whole_reply
from semantic.api.usage import chat_usage
from semantic.core import (
    AGENT_ID_PATTERN,
    FinishReason,
    TokenEvent,
    TokenLogprob,
)
from semantic.errors import InvalidRequest
from semantic.models.served import ServedModel
from semantic.settings.settings import Settings
from semantic.text import client_json
from semantic.text.chat import template_tool_call
from semantic.text.reasoning import ThinkingSwitch
from semantic.text.tools import TextDelta

router = APIRouter(route_class=PromptRoute)

# What the generation routes answer, for the OpenAPI document.
GENERATION_RESPONSES = {200: STREAMED_OR_JSON, **error_responses("openai", 400, 404, 413, 500, 503)}


class _Body(BaseModel):
    # Accept generously (unknown fields are ignored), but no silent type coercion.
    model_config = ConfigDict(extra="ignore", strict=True, allow_inf_nan=False)


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
    # A thinking model's reasoning, sent back (vLLM's and llama.cpp's name, and the older one).
    reasoning_content: str | None = None
    reasoning: str | None = None


class StreamOptions(_Body):
    include_usage: bool = False


_STOP = {"type": "string", "minLength": 1}
_STOPS = {"anyOf": [_STOP, {"type": "array", "items": _STOP}, {"type": "null"}], "default": None}


class GenerationFields(_Body):
    """What the chat and the legacy completions bodies share: the model, streaming, the output
    budget, sampling, and the extensions."""

    model: str = Field(min_length=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(None, ge=1)
    # Left out, each is the served model's recommendation (`ServedModel.sampling`).
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=-1, description="0 or -1 is off.")
    repetition_penalty: float | None = Field(None, gt=0, le=2, description="1 is off.")
    seed: int | None = None
    # An empty stop string would end every answer before its first token (`sampling_of`).
    stop: Annotated[str | list[str] | None, WithJsonSchema(_STOPS)] = None
    n: int = Field(1, ge=1, json_schema_extra={"maximum": 1})  # others: a 400 of our own
    # Extensions that benchmarks and agent clients rely on (vLLM spells them the same way).
    ignore_eos: bool = False
    min_tokens: int = Field(0, ge=0)
    session_id: str | None = Field(None, pattern=AGENT_ID_PATTERN)


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


def sampling_of(body: GenerationFields) -> Sampling:
    """The sampling fields both bodies share; an empty stop string is a 400."""
    stops = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
    if any(not stop for stop in stops):
        raise InvalidRequest("stop: a stop sequence may not be empty", param="stop")
    return Sampling(
        body.temperature,
        body.top_p,
        None if body.top_k is None else max(body.top_k, 0),
        body.repetition_penalty,
        body.seed,
        body.min_tokens,
        tuple(stops),
        body.ignore_eos,
    )


def finish_reason_json(reason: FinishReason | None) -> str:
    return "length" if reason is FinishReason.LENGTH else "stop"


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
    include_usage = body.stream_options is not None and body.stream_options.include_usage
    return await reply.submitted.respond(
        request,
        body.stream,
        partial(completion.chunks, reply.parsed, chat.tools, include_usage),
        partial(completion.collect, reply.parsed, chat.tools),
        _error_chunk,
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
                yield data_event(error_payload(event.error))
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


# -- legacy completions: raw text in, text out, no chat template ----------

LEGACY_MAX_TOKENS = 16  # the legacy API's default when a request gives no max_tokens

# One prompt: text or token ids, alone or as a list of one. What the document says of it is
# what `completion_prompt` and the engine check by hand (with their own messages): not empty,
# one prompt, ids from 0 (and within the served model's vocabulary, which no schema knows).
_TEXT = {"type": "string", "minLength": 1}
_IDS = {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 1}
_ONE = {"minItems": 1, "maxItems": 1}
Prompt = Annotated[
    str | list[int] | list[str] | list[list[int]],
    WithJsonSchema(
        {
            "anyOf": [
                _TEXT,
                _IDS,
                {"type": "array", "items": _TEXT, **_ONE},
                {"type": "array", "items": _IDS, **_ONE},
            ]
        }
    ),
]


class CompletionRequest(GenerationFields):
    prompt: Prompt
    echo: bool = False
    logprobs: int | None = Field(None, ge=0, le=MAX_LEGACY_LOGPROBS)
    # Accepted at their neutral values only (`refuse_unsupported`).
    best_of: int | None = Field(None, ge=1, json_schema_extra={"maximum": 1})
    suffix: str | None = Field(None, json_schema_extra={"maxLength": 0})

    # The prompt's log probabilities are not computed: no `logprobs` with `echo`.
    model_config = ConfigDict(
        json_schema_extra={
            "if": {"properties": {"logprobs": {"type": "integer"}}, "required": ["logprobs"]},
            "then": {"properties": {"echo": {"const": False}}},
        }
    )


def refuse_unsupported(body: CompletionRequest) -> None:
    """A 400 that names the first field asking for something this server does not do."""
    refused = [
        ("n", body.n != 1, "only n=1 is supported"),
        ("best_of", body.best_of not in (None, 1), "only best_of=1 is supported"),
        (
            "logprobs",
            body.logprobs is not None and body.echo,
            "logprobs with echo (the prompt's log probabilities) are not supported",
        ),
        ("suffix", bool(body.suffix), "suffix is not supported"),
    ]
    for param, asked, message in refused:
        if asked:
            raise InvalidRequest(message, param=param)


def completion_prompt(model: ServedModel, prompt: Prompt) -> tuple[list[int], str]:
    """The prompt's token ids and its text (what `echo` puts before the answer). Text is
    tokenized as is, after BOS where the model expects one on raw text; token ids are taken
    as they are, once checked against the vocabulary."""
    single = _single_prompt(prompt)
    if isinstance(single, str):
        ids = model.tokenizer.encode(single)
        bos = model.tokenizer.bos_token_id
        return ([bos, *ids] if model.tokenizer.add_bos and bos is not None else ids), single
    vocab = model.config.vocab_size
    outside = next((token for token in single if not 0 <= token < vocab), None)
    if outside is not None:
        raise InvalidRequest(
            f"prompt: token id {outside} is outside the vocabulary (0 to {vocab - 1})",
            param="prompt",
        )
    return single, model.tokenizer.decode(single)


def _single_prompt(prompt: Prompt) -> str | list[int]:
    if isinstance(prompt, str) or not prompt or isinstance(prompt[0], int):
        return cast("str | list[int]", prompt)
    batch = cast("list[str] | list[list[int]]", prompt)
    if len(batch) > 1:
        raise InvalidRequest("prompt: only one prompt per request is supported", param="prompt")
    return batch[0]


@router.post("/v1/completions", responses=GENERATION_RESPONSES)
async def completions(body: CompletionRequest, request: Request) -> Response:
    refuse_unsupported(body)
    agent = named_agent(request.headers, body.session_id, param="session_id")
    sampling = sampling_of(body)
    engine = pipeline.admit(request, body.model, 0, 0, sampling, agent)
    trail = Trail.of(engine, body.logprobs)
    prompt_ids, prompt_text = await asyncio.to_thread(completion_prompt, engine.model, body.prompt)
    budget = OutputBudget(body.max_tokens, LEGACY_MAX_TOKENS, prompt_param="prompt")
    params = partial(sampling.params, engine.model.sampling, logprobs=body.logprobs)
    submitted = await pipeline.submit(request, engine, prompt_ids, budget, params, agent)
    echo = prompt_text if body.echo else ""
    completion = _TextCompletion(int(time.time()), body.model, echo, trail)
    followed = trail.follow(submitted.events)
    include_usage = body.stream_options is not None and body.stream_options.include_usage
    return await submitted.respond(
        request,
        body.stream,
        partial(completion.chunks, followed, include_usage),
        partial(completion.collect, followed),
        _error_chunk,
        KEEP_ALIVE,
    )


def _error_chunk(exc: Exception) -> str:
    return data_event(error_payload(exc))


class _TextCompletion:
    """One legacy completion's identity, shared by its chunks or its single JSON body. `echo`
    is the text that goes before the answer: the prompt's, or "" without `echo`. `trail` holds
    its tokens' log probabilities: each chunk carries those that came since the last one."""

    def __init__(self, created: int, model: str, echo: str, trail: Trail) -> None:
        self.id, self.created, self.model = f"cmpl-{uuid.uuid4().hex}", created, model
        self.echo, self.trail = echo, trail
        self._offset = len(echo)  # where the next token's text starts in the choice's text

    def _body(self, choices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": choices,
            **extra,
        }

    def _choice(
        self,
        text: str,
        finish_reason: str | None = None,
        logprobs: list[TokenLogprob] | None = None,
    ) -> dict[str, Any]:
        shown = None
        if self.trail.asked and logprobs is not None:
            shown = legacy_json(self.trail.tokenizer, logprobs, self._offset)
            self._offset += sum(map(len, shown["tokens"]))
        return {"text": text, "index": 0, "logprobs": shown, "finish_reason": finish_reason}

    async def chunks(
        self, events: AsyncIterator[TokenEvent], include_usage: bool
    ) -> AsyncIterator[str]:
        if self.echo:
            yield data_event(self._body([self._choice(self.echo)]))
        async for event in events:
            if event.error is not None:
                yield _error_chunk(event.error)
                return
            finish = (
                None if event.finish_reason is None else finish_reason_json(event.finish_reason)
            )
            if event.text or finish is not None:
                choice = self._choice(event.text, finish, self.trail.take())
                yield data_event(self._body([choice]))
            if finish is not None and include_usage and event.usage is not None:
                yield data_event(self._body([], usage=chat_usage(event.usage)))
        yield DONE

    async def collect(self, events: AsyncIterator[TokenEvent]) -> dict[str, Any]:
        text, final = await whole_answer(events)
        assert final.usage is not None
        reason = finish_reason_json(final.finish_reason)
        choice = self._choice(self.echo + text, reason, self.trail.all)
        return self._body([choice], usage=chat_usage(final.usage))
