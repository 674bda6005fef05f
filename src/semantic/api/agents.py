"""The direct agent API under /v1/agents: create, list, inspect, pin, fork, persist and delete
agents and their caches, and generate (the server keeps the conversation: `api/agent_turn.py`);
and how a request of any API names its agent (`named_agent`). Errors are OpenAI-shaped."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field

from semantic.api import limits, rate_limits
from semantic.api.admin import engine_of
from semantic.api.agent_turn import (
    GenerateBody,
    Generation,
    Sampling,
    Turn,
    error_event,
)
from semantic.api.bodies import LimitedBodyRoute
from semantic.api.errors import OpenAIError
from semantic.api.openapi import SSE_EVENT
from semantic.api.streaming import after_the_200, sse_response, unless_disconnected, with_keep_alive
from semantic.cache.agents import Agent
from semantic.cache.conversation import Conversation
from semantic.core import AGENT_ID_PATTERN, is_valid_agent_id
from semantic.engine.engine import Engine
from semantic.errors import InvalidRequest, NotFound, PersistFailed
from semantic.observability import bind_agent

router = APIRouter(tags=["agents"], route_class=LimitedBodyRoute)

SESSION_HEADER = "x-session-id"


def named_agent(
    headers: Mapping[str, str], name: str | None = None, param: str = SESSION_HEADER
) -> str | None:
    """The agent a request names explicitly, in any API: `name` (the body's own field, such as
    OpenAI's `session_id`), else the `x-session-id` header; None when it names none, and then
    prefix reuse finds its cache by content. A name that is not a valid agent id is a 400."""
    agent_id = name
    if name is None:  # a bad header is blamed on the header, not on the body's field
        agent_id, param = headers.get(SESSION_HEADER), SESSION_HEADER
    if agent_id is not None and not is_valid_agent_id(agent_id):
        raise InvalidRequest(f"{param} must match {AGENT_ID_PATTERN}", param=param)
    bind_agent(agent_id)
    return agent_id


def _checked(agent_id: str) -> str:
    if not is_valid_agent_id(agent_id):
        raise InvalidRequest(f"invalid agent id {agent_id[:40]!r}", param="agent_id")
    bind_agent(agent_id)
    return agent_id


# -- what goes over the wire (also the OpenAPI document) ----------------------------------


_ERROR_TEXT = {
    400: "An invalid agent id or body (the message names the field), or a conversation that "
    "no longer fits the context (code `context_length_exceeded`).",
    404: "No such agent.",
    409: "The agent id is taken, or the agent is generating (code `conflict`).",
    500: "A fault in the server (the log has the details); for persist, a disk write that "
    "failed (code `persist_failed`).",
}


def _errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """The errors a route answers, in the OpenAI shape the agent API speaks (`api/errors.py`);
    any route may fail with a 500."""
    return {
        status: {"model": OpenAIError, "description": _ERROR_TEXT[status]}
        for status in (*statuses, 500)
    }


class ConversationSummary(BaseModel):
    system: str | None
    defaults: dict[str, Any]
    messages: int


class AgentInfo(BaseModel):
    """An agent and its cache statistics (`Agents.describe`)."""

    agent_id: str
    cached_tokens: int
    pinned: bool
    working: bool
    requests: int
    hit_tokens: int
    disk_hit_tokens: int
    miss_tokens: int
    miss_reasons: dict[str, int]
    bytes_in_memory: int = Field(description="The pool pages its next turn reads.")
    bytes_full_attention: int = Field(
        description="What its blocks would take with every layer's K/V (sliding windows keep less)."
    )
    bytes_on_disk: int
    last_used: float
    generating: bool
    conversation: ConversationSummary | None = Field(
        description="What the server keeps for generate; null for an agent that only chat "
        "requests named (its first generate starts an empty one)."
    )


class AgentList(BaseModel):
    object: str = "list"
    data: list[AgentInfo]


class AgentCreate(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    agent_id: str | None = Field(
        None, pattern=AGENT_ID_PATTERN, description="Generated (`agent_...`) when absent."
    )
    system: str | None = Field(None, description="The system prompt of every turn.")
    defaults: Sampling = Field(
        default_factory=Sampling, description="Sampling settings for every turn."
    )


class AgentFork(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    agent_id: str | None = Field(
        None, pattern=AGENT_ID_PATTERN, description="The new agent's id; generated when absent."
    )


class AgentUpdate(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    pinned: bool


class Deleted(BaseModel):
    id: str
    object: str = "agent"
    deleted: bool = True


class Persisted(BaseModel):
    agent_id: str
    blocks_written: int = Field(description="Blocks that were not on disk yet.")
    durable: bool = True


class ChatMessage(BaseModel):
    role: str
    content: str


class MessageList(BaseModel):
    object: str = "list"
    agent_id: str
    system: str | None
    data: list[ChatMessage]


_JSON_OR_SSE = {
    "description": "The reply as JSON; with `stream: true`, server-sent events: `delta` "
    "(`{type, text}`) any number of times, then `done` (`{type, ...Generation}`) or `error` "
    "(`{type, error}`).",
    "content": {"text/event-stream": {"schema": SSE_EVENT}},
}


# -- routes -----------------------------------------------------------------------------------


@router.post("/v1/agents", status_code=201, response_model=AgentInfo, responses=_errors(400, 409))
async def create_agent(request: Request, body: AgentCreate | None = None) -> dict[str, Any]:
    """Create an agent with a system prompt and sampling defaults; nothing is cached until its
    first generate. Of two creates of one id, exactly one wins (the other gets 409)."""
    engine, body = engine_of(request), body or AgentCreate()
    agent_id = body.agent_id or _new_id()
    defaults = body.defaults.settings()
    limits.check_stops(request.app.state.settings, defaults.stop or (), "defaults.stop")
    conversation = Conversation(body.system, defaults)
    return await _created(engine, lambda: engine.agents.create(agent_id, conversation))


@router.get("/v1/agents", response_model=AgentList, responses=_errors())
async def list_agents(request: Request) -> dict[str, Any]:
    engine = engine_of(request)
    snapshot: dict[str, Any] = await engine.call(engine.agents.snapshot)
    return {"object": "list", "data": snapshot["agents"]}


@router.get("/v1/agents/{agent_id}", response_model=AgentInfo, responses=_errors(400, 404))
async def get_agent(agent_id: str, request: Request) -> dict[str, Any]:
    engine, agent_id = engine_of(request), _checked(agent_id)
    described: dict[str, Any] | None = await engine.call(lambda: engine.agents.describe(agent_id))
    if described is None:
        raise NotFound(f"no agent {agent_id!r}")
    return described


@router.patch("/v1/agents/{agent_id}", response_model=AgentInfo, responses=_errors(400))
async def update_agent(agent_id: str, body: AgentUpdate, request: Request) -> dict[str, Any]:
    """Pin (or unpin) an agent: a pinned agent's cache never leaves memory or disk."""
    engine, agent_id = engine_of(request), _checked(agent_id)

    def apply() -> dict[str, Any] | None:
        engine.agents.pin(agent_id, body.pinned)
        return engine.agents.describe(agent_id)

    described: dict[str, Any] | None = await engine.call(apply)
    assert described is not None
    return described


@router.delete("/v1/agents/{agent_id}", response_model=Deleted, responses=_errors(400, 404, 409))
async def delete_agent(agent_id: str, request: Request) -> dict[str, Any]:
    """Forget the agent and its conversation; frees its blocks in memory and on disk that no
    other agent shares. Its id can be created again."""
    engine, agent_id = engine_of(request), _checked(agent_id)
    if not await engine.call(lambda: engine.agents.delete(agent_id)):
        raise NotFound(f"no agent {agent_id!r}")
    return {"id": agent_id, "object": "agent", "deleted": True}


@router.post(
    "/v1/agents/{agent_id}/generate",
    response_model=Generation,
    responses={200: _JSON_OR_SSE, **_errors(400, 404, 409)},
)
async def generate(agent_id: str, body: GenerateBody, request: Request) -> Response:
    """One turn: the new user message after the agent's whole conversation, rendered through
    the chat template (the agent's cache serves what it has seen); the reply joins the
    conversation, on disk, before the answer (or the `done` event) goes out. One turn at a
    time per agent: 409 while another runs."""
    engine, agent_id = engine_of(request), _checked(agent_id)
    rate_limits.check_agent(request, agent_id)
    turn = await Turn.begin(engine, agent_id, request.state.request_id)
    try:
        generation = await turn.request(body, request.app.state.settings)
        events = engine.stream(generation)
    except BaseException:
        turn.abandon()
        raise
    if body.stream:
        frames = after_the_200(turn.frames(events), events, error_event)
        return sse_response(with_keep_alive(frames, request.app.state.settings.keep_alive_s))
    try:
        return JSONResponse(await unless_disconnected(request, turn.answer(events)))
    finally:
        turn.abandon()


@router.post(
    "/v1/agents/{agent_id}/fork",
    status_code=201,
    response_model=AgentInfo,
    responses=_errors(400, 404, 409),
)
async def fork_agent(
    agent_id: str, request: Request, body: AgentFork | None = None
) -> dict[str, Any]:
    """A new agent with a copy of this one's conversation, sharing its cache: no block is
    copied until one of them extends the shared partial last block."""
    engine, parent = engine_of(request), _checked(agent_id)
    child = (body.agent_id if body else None) or _new_id()
    return await _created(engine, lambda: engine.agents.fork(parent, child))


@router.post("/v1/agents/{agent_id}/persist", response_model=Persisted, responses=_errors(400, 404))
async def persist_agent(agent_id: str, request: Request) -> dict[str, Any]:
    """Write the agent's cache and conversation to disk; answers once they are fsynced."""
    engine, agent_id = engine_of(request), _checked(agent_id)
    if await engine.call(lambda: engine.agents.describe(agent_id)) is None:
        raise NotFound(f"no agent {agent_id!r}")
    result = await engine.persist([agent_id])
    if result.failed or result.agents_failed:
        raise PersistFailed(
            f"agent {agent_id!r} is not durable: {result.failed} block writes failed, or its "
            "manifest could not be written (see the server log)"
        )
    return {"agent_id": agent_id, "blocks_written": result.blocks_written, "durable": True}


@router.get(
    "/v1/agents/{agent_id}/messages", response_model=MessageList, responses=_errors(400, 404)
)
async def agent_messages(agent_id: str, request: Request) -> dict[str, Any]:
    """The conversation the server keeps for the agent, oldest message first."""
    engine, agent_id = engine_of(request), _checked(agent_id)

    def read() -> Conversation | None:
        agent = engine.agents.by_id.get(agent_id)
        return None if agent is None else agent.conversation or Conversation()

    conversation = await engine.call(read)
    if conversation is None:
        raise NotFound(f"no agent {agent_id!r}")
    data = [{"role": m.role, "content": m.content} for m in conversation.messages]
    return {"object": "list", "agent_id": agent_id, "system": conversation.system, "data": data}


def _new_id() -> str:
    return f"agent_{uuid.uuid4().hex[:24]}"


async def _created(engine: Engine, create: Callable[[], Agent]) -> dict[str, Any]:
    """Run `create` on the engine thread, then write the new agent's manifest off it, so the
    agent survives a restart from the moment it is acknowledged."""

    def create_and_describe() -> tuple[Agent, dict[str, Any] | None]:
        agent = create()
        return agent, engine.agents.describe(agent.agent_id)

    agent, described = await engine.call(create_and_describe)
    await asyncio.to_thread(engine.agents.save_manifest, agent)
    assert described is not None
    return described
