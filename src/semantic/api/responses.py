"""OpenAI Responses API (what Codex speaks): `POST /v1/responses`, `GET` / `DELETE
/v1/responses/{id}` and `GET /v1/responses/{id}/input_items`.

Translation only: the body and its input items are read in responses_request.py, stored
responses kept in responses_store.py, SSE bytes live in streaming.py. A stored response chain
is an agent (`chain_agent`): once a response continues a chain, the chain is an agent named
after its first response, so each next response reads the chain's KV from the agent cache
(memory or disk, after a restart too) and `usage.input_tokens_details.cached_tokens` shows it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Mapping
from functools import partial
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from semantic.api import pipeline
from semantic.api.auth import caller_of
from semantic.api.bodies import parse_body
from semantic.api.errors import error_payload
from semantic.api.limits import OutputBudget
from semantic.api.openai_tools import (
    FunctionName,
    NamedToolChoice,
    ToolChoiceField,
    template_tools,
    tool_use_of,
)
from semantic.api.openapi import STREAMED_OR_JSON, error_responses, json_body
from semantic.api.pipeline import ChatRequest, Sampling, render_messages
from semantic.api.prompt_bounds import PromptRoute
from semantic.api.prompt_cache import prompt_cache_agent, retention_of
from semantic.api.responses_output import OutputItems, item_id, public
from semantic.api.responses_request import (
    ResponsesBody,
    input_items,
    item_messages,
)
from semantic.api.responses_store import ResponseStore, StoredResponse
from semantic.api.seal import Seals
from semantic.api.streaming import (
    named_event,
    prefill_comments,
)
from semantic.api.thinking import Thinking, seals_of
from semantic.api.tool_use import ReplyEvent, ToolUse
from semantic.api.usage import responses_usage
from semantic.core import FinishReason, SamplingParams, TokenEvent
from semantic.errors import InvalidRequest, NotFound, PreviousResponseNotFound
from semantic.models.served import ServedModel
from semantic.text.reasoning import ThinkingSwitch
from semantic.text.tokenizer import Tokenizer

router = APIRouter(route_class=PromptRoute)

# Codex drops a stream that sends no event for 300 s (`stream_idle_timeout_ms`) and asks again,
# up to five times, each time prefilling the prompt anew; an SSE comment is no event to it. A
# cold prefill of its ~8.7K-token first request on a small CPU can take longer (measured: each
# of four tries cut at ~330 s). So while a stream is silent, its heartbeat carries
# `response.in_progress` again every this long.
IN_PROGRESS_AFTER_S = 30.0


def store_of(request: Request) -> ResponseStore:
    store: ResponseStore = request.app.state.responses
    return store


# -- the agent -----------------------------------------------------------------------------


def chain_agent(
    body: ResponsesBody, headers: Mapping[str, str], chain: list[StoredResponse]
) -> str | None:
    """The agent a response continues: its chain's (the agent a response of it named, else one
    named after its first response: a chain becomes an agent once a response continues it),
    else the one the request names (`session_id`, `x-session-id`, then Codex's
    `prompt_cache_key`), else none. A stored response that continues nothing is a one-off
    until one does (the API stores every response unless told not to, and a burst of one-shot
    calls must not pass for working agents, whose caches side requests may not evict); prefix
    reuse still finds its cache by content when its chain goes on."""
    if chain:
        return chain[-1].agent_id or chain[0].id
    return prompt_cache_agent(headers, body.session_id, body.prompt_cache_key)


# -- the prompt ----------------------------------------------------------------------------


def prompt_messages(
    body: ResponsesBody, chain: list[StoredResponse], new_messages: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """The prompt's messages: the chain's (each response's input and output), then the new
    input, after this request's `instructions` (they are not carried over a chain, as the API
    says)."""
    system = [{"role": "system", "content": body.instructions}] if body.instructions else []
    return system + [m for stored in chain for m in stored.messages] + new_messages


def _tool_use(model: ServedModel, body: ResponsesBody) -> ToolUse:
    functions = body.functions()
    choice = body.tool_choice
    mode: ToolChoiceField = "auto"
    if isinstance(choice, str):
        mode = choice
    elif choice is not None and choice.type in ("function", "custom"):
        name = getattr(choice, "name", None)
        if isinstance(name, str):
            mode = NamedToolChoice(type="function", function=FunctionName(name=name))
    return tool_use_of(model, functions or None, mode, body.parallel_tool_calls)


# -- the response --------------------------------------------------------------------------


class _Response:
    """One response's identity and settings, shared by its events, its JSON body and its
    stored record."""

    def __init__(
        self,
        body: ResponsesBody,
        response_id: str,
        tokenizer: Tokenizer,
        seals: Seals,
        sampling: SamplingParams,
    ) -> None:
        self.body = body
        self.sampling = sampling  # what the response echoes: the request's, filled in
        self.id = response_id
        self.created_at = int(time.time())
        self.tokenizer = tokenizer
        # Reasoning items carry their seal when the request includes `encrypted_content`.
        sealed = "reasoning.encrypted_content" in (body.include or [])
        self.seals = seals if sealed else None

    def json(
        self,
        status: str,
        output: list[dict[str, Any]],
        final: TokenEvent | None = None,
        error: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        body = self.body
        length = final is not None and final.finish_reason is FinishReason.LENGTH
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "background": False,
            "error": error,
            "incomplete_details": {"reason": "max_output_tokens"} if length else None,
            "instructions": body.instructions,
            "max_output_tokens": body.max_output_tokens,
            "model": body.model,
            "output": [public(item) for item in output],
            "parallel_tool_calls": body.parallel_tool_calls,
            "previous_response_id": body.previous_response_id,
            "reasoning": {
                "effort": body.reasoning.effort if body.reasoning else None,
                "summary": None,
            },
            "store": body.store,
            "temperature": self.sampling.temperature,
            "text": {"format": _format_json(body)},
            "tool_choice": _tool_choice_json(body),
            "tools": [tool.model_dump(exclude_none=True) for tool in body.tools or []],
            "top_logprobs": body.top_logprobs,
            "top_p": self.sampling.top_p,
            "truncation": "disabled",
            "usage": None
            if final is None or final.usage is None
            else responses_usage(final.usage, self._reasoning_tokens(output)),
            "user": None,
            "metadata": body.metadata or {},
        }

    def _reasoning_tokens(self, output: list[dict[str, Any]]) -> int:
        """The reasoning's tokens, counted again from its text (the engine counts the output,
        not which of it was reasoning)."""
        texts = [
            p["text"] for item in output if item["type"] == "reasoning" for p in item["content"]
        ]
        return len(self.tokenizer.encode("".join(texts))) if texts else 0

    def status_of(self, final: TokenEvent) -> str:
        return "incomplete" if final.finish_reason is FinishReason.LENGTH else "completed"


def _format_json(body: ResponsesBody) -> dict[str, Any]:
    if body.text is None or body.text.format is None:
        return {"type": "text"}
    return body.text.format.model_dump(exclude_none=True, by_alias=True)


def _tool_choice_json(body: ResponsesBody) -> Any:
    choice = body.tool_choice
    if choice is None:
        return "auto"
    return choice if isinstance(choice, str) else choice.model_dump(exclude_none=True)


# -- the routes ----------------------------------------------------------------------------


@router.post(
    "/v1/responses",
    openapi_extra=json_body(ResponsesBody, prefix="Responses"),
    responses={200: STREAMED_OR_JSON, **error_responses("openai", 400, 404, 413, 500, 503)},
)
async def create_response(request: Request) -> Response:
    body = await parse_body(request, ResponsesBody)
    owner, store = caller_of(request).owner, store_of(request)
    chain: list[StoredResponse] = []
    if body.previous_response_id is not None:
        chain = await _chain(store, body.previous_response_id, owner)
    items = input_items(body)
    seals = seals_of(request)
    new_messages = item_messages(items, seals)
    body.check_tool_names()
    agent = chain_agent(body, request.headers, chain)
    history = sum(len(stored.messages) for stored in chain)
    sampling = Sampling(body.temperature, body.top_p)
    messages = history + len(new_messages)
    engine = pipeline.admit(request, body.model, messages, body.tool_count(), sampling, agent)
    chat = _chat_request(request, body, engine.model, chain, new_messages, sampling, agent)
    reply = await pipeline.start(request, engine, chat)
    sampled = reply.submitted.generation.sampling  # what the response echoes: filled in
    response = _Response(body, item_id("resp"), engine.model.tokenizer, seals, sampled)
    record = _Record(store, response, items, new_messages, agent, owner)
    output = OutputItems(body.offered_tools(), response.seals, reply.trail)
    comment = prefill_comments(reply.submitted.progress)
    return await reply.submitted.respond(
        request,
        body.stream,
        partial(_frames, response, reply.parsed, output, record),
        partial(_collect, response, reply.parsed, output, record),
        _error_frame,
        _heartbeat(response, output, comment),
    )


def _chat_request(
    request: Request,
    body: ResponsesBody,
    model: ServedModel,
    chain: list[StoredResponse],
    new_messages: list[dict[str, Any]],
    sampling: Sampling,
    agent: str | None,
) -> ChatRequest:
    """The body as the chat pipeline reads it (its prompt: `prompt_messages`)."""
    messages = prompt_messages(body, chain, new_messages)
    settings = request.app.state.settings
    effort = body.reasoning.effort if body.reasoning is not None else None
    output_format = body.text.format.output_format() if body.text and body.text.format else None
    budget = OutputBudget(
        body.max_output_tokens,
        settings.default_max_tokens,
        param="max_output_tokens",
        prompt_param="input",
    )
    return ChatRequest(
        tools=_tool_use(model, body),
        thinking=Thinking.of(model, ThinkingSwitch.from_effort(effort)),
        render=partial(render_messages, model, messages, template_tools(body.functions())),
        budget=budget,
        sampling=sampling,
        output=output_format,
        agent=agent,
        logprobs=body.logprobs(),
        breakpoints=partial(
            retention_of, body.prompt_cache_retention, max_ttl_s=settings.max_retention_ttl_s
        ),
    )


async def _chain(store: ResponseStore, last_id: str, owner: str | None) -> list[StoredResponse]:
    """The stored chain a request continues; OpenAI's 400 when a response of it is gone (or
    is another key's)."""
    try:
        return await asyncio.to_thread(store.chain, last_id, owner)
    except NotFound:
        raise PreviousResponseNotFound(last_id) from None


class _Record:
    """What a finished response leaves in the store, when the request asked for `store`."""

    def __init__(
        self,
        store: ResponseStore,
        reply: _Response,
        items: list[dict[str, Any]],
        messages: list[dict[str, Any]],
        agent: str | None,
        owner: str | None,
    ) -> None:
        self.store, self.reply, self.items, self.messages = store, reply, items, messages
        self.agent, self.owner = agent, owner

    async def save(self, response: dict[str, Any]) -> None:
        if not self.reply.body.store:
            return
        # The output's own reasoning text is whole: no seal of it is opened (nor counted).
        output_messages = item_messages(response["output"], seals=None)
        stored = StoredResponse(
            response=response,
            input_items=[_with_id(item) for item in self.items if isinstance(item, dict)],
            messages=self.messages + output_messages,
            agent_id=self.agent,
            owner=self.owner,
        )
        await asyncio.to_thread(self.store.save, stored)


def _with_id(item: dict[str, Any]) -> dict[str, Any]:
    """An input item as the input_items list shows it: with an id and a type, a message's text
    as parts."""
    kind = item.get("type", "message")
    stored = {"id": item_id("msg" if kind == "message" else "item"), **item, "type": kind}
    if kind == "message":
        content = item.get("content")
        if isinstance(content, str):
            part = "output_text" if item.get("role") == "assistant" else "input_text"
            stored["content"] = [{"type": part, "text": content}]
        stored.setdefault("status", "completed")
    return stored


async def _collect(
    reply: _Response,
    parsed: AsyncIterator[tuple[list[ReplyEvent], TokenEvent]],
    output: OutputItems,
    record: _Record,
) -> dict[str, Any]:
    async for tool_events, event in parsed:
        if event.error is not None:
            raise event.error
        for tool_event in tool_events:
            output.feed(tool_event)
        if event.final:
            output.close()
            response = reply.json(reply.status_of(event), output.items, event)
            await record.save(response)
            return response
    raise RuntimeError("the engine ended a request without a final event")


async def _frames(
    reply: _Response,
    parsed: AsyncIterator[tuple[list[ReplyEvent], TokenEvent]],
    output: OutputItems,
    record: _Record,
) -> AsyncIterator[str]:
    """The Responses event stream: created and in_progress at once (before the prompt is
    prefilled), each output item's events, then completed (or incomplete); an `error` event
    and `response.failed` if the engine fails after the 200."""
    start = reply.json("in_progress", [])
    for kind in ("response.created", "response.in_progress"):
        yield _frame(output.event({"type": kind, "response": start}))
    async for tool_events, event in parsed:
        if event.error is not None:
            for frame in _failure(output, reply, event.error):
                yield frame
            return
        for tool_event in tool_events:
            for payload in output.feed(tool_event):
                yield _frame(payload)
        if event.final:
            for payload in output.close():
                yield _frame(payload)
            status = reply.status_of(event)
            response = reply.json(status, output.items, event)
            await record.save(response)
            kind = "response.completed" if status == "completed" else "response.incomplete"
            yield _frame(output.event({"type": kind, "response": response}))
            return


def _heartbeat(
    reply: _Response, output: OutputItems, comment: Callable[[], str]
) -> Callable[[], str]:
    """What goes out while nothing else does (a long prefill): a comment with the prefill's
    progress, and every `IN_PROGRESS_AFTER_S` at most, `response.in_progress` again, the
    response as it stands. (It runs while `_frames` waits on the engine, so `output` is between
    two events and its sequence numbers stay in order.)"""
    last_event = time.monotonic()  # in_progress went out with the 200

    def beat() -> str:
        nonlocal last_event
        if time.monotonic() - last_event < IN_PROGRESS_AFTER_S:
            return comment()
        last_event = time.monotonic()
        still = {
            "type": "response.in_progress",
            "response": reply.json("in_progress", output.items),
        }
        return comment() + _frame(output.event(still))

    return beat


def _failure(output: OutputItems, reply: _Response, exc: Exception) -> list[str]:
    detail = error_payload(exc)["error"]
    error = {"type": "error", "code": detail["code"] or detail["type"]}
    error |= {"message": detail["message"], "param": None}
    failed = reply.json(
        "failed", output.items, error={"code": error["code"], "message": error["message"]}
    )
    return [
        _frame(output.event(error)),
        _frame(output.event({"type": "response.failed", "response": failed})),
    ]


def _frame(payload: dict[str, Any]) -> str:
    return named_event(str(payload["type"]), payload)


def _error_frame(exc: Exception) -> str:
    detail = error_payload(exc)["error"]
    payload = {"type": "error", "code": detail["code"] or detail["type"]}
    return _frame(payload | {"message": detail["message"], "param": None, "sequence_number": 0})


@router.get("/v1/responses/{response_id}", responses=error_responses("openai", 404, 500))
async def get_response(response_id: str, request: Request) -> dict[str, Any]:
    stored = await asyncio.to_thread(store_of(request).load, response_id, caller_of(request).owner)
    return stored.response


@router.delete("/v1/responses/{response_id}", responses=error_responses("openai", 404, 500))
async def delete_response(response_id: str, request: Request) -> dict[str, Any]:
    await asyncio.to_thread(store_of(request).delete, response_id, caller_of(request).owner)
    return {"id": response_id, "object": "response", "deleted": True}


@router.get(
    "/v1/responses/{response_id}/input_items", responses=error_responses("openai", 400, 404, 500)
)
async def list_input_items(response_id: str, request: Request) -> dict[str, Any]:
    """A stored response's input items, newest first unless `order=asc`, `limit` (1 to 100,
    default 20) at a time, after the item `after`."""
    stored = await asyncio.to_thread(store_of(request).load, response_id, caller_of(request).owner)
    query = request.query_params
    limit = _limit(query.get("limit"))
    order = query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise InvalidRequest("order must be 'asc' or 'desc'", param="order")
    items = stored.input_items if order == "asc" else stored.input_items[::-1]
    after = query.get("after")
    if after is not None:
        ids = [item.get("id") for item in items]
        items = items[ids.index(after) + 1 :] if after in ids else []
    page = items[:limit]
    return {
        "object": "list",
        "data": page,
        "first_id": page[0]["id"] if page else None,
        "last_id": page[-1]["id"] if page else None,
        "has_more": len(items) > limit,
    }


def _limit(value: str | None) -> int:
    if value is None:
        return 20
    if not value.isdigit() or not 1 <= int(value) <= 100:
        raise InvalidRequest(
            f"limit: must be an integer from 1 to 100, not {value[:20]!r}", param="limit"
        )
    return int(value)
