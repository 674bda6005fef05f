"""The direct agent API under /v1/agents: create, list, inspect, pin, fork, persist and delete
agents and their caches, and generate (the server keeps the conversation: `api/agent_turn.py`);
and how a request of any API names its agent (`named_agent`). Errors are OpenAI-shaped.

Every route goes through the engine's agent door (`engine/agent_door.py`) as the request's
caller (`auth.caller_of`): a key sees its own agents only, an admin key every key's."""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Mapping
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field

from semantic.api import cache_miss, limits, rate_limits
from semantic.api.admin import engine_of
from semantic.api.agent_turn import (
    GenerateBody,
    Generation,
    Sampling,
    Turn,
    error_event,
)
from semantic.api.auth import caller_of
from semantic.api.bodies import LimitedBodyRoute
from semantic.api.cache_miss import CACHE_MISS_HEADER_DOC
from semantic.api.errors import OpenAIError
from semantic.api.openapi import SSE_EVENT
from semantic.api.streaming import after_the_200, sse_response, unless_disconnected, with_keep_alive
from semantic.cache.agents.conversation import Conversation
from semantic.cache.agents.manifest import OWNER_PATTERN, UNOWNED
from semantic.core import AGENT_ID_PATTERN, is_valid_agent_id
from semantic.errors import InvalidRequest, PersistFailed
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


def agent_id_from(name: str) -> str:
    """A valid agent id for `name`, the same every time: the name itself when it is one,
    else a digest of it (a client's own session name: Claude Code's `metadata.user_id`,
    OpenAI's `prompt_cache_key`)."""
    if is_valid_agent_id(name):
        return name
    return "user-" + hashlib.blake2b(name.encode(errors="replace"), digest_size=12).hexdigest()


def _checked(agent_id: str) -> str:
    if not is_valid_agent_id(agent_id):
        raise InvalidRequest(f"invalid agent id {agent_id[:40]!r}", param="agent_id")
    bind_agent(agent_id)
    return agent_id


# -- what goes over the wire (also the OpenAPI document) ----------------------------------


_ERROR_TEXT = {
    400: "An invalid agent id or body (the message names the field), a conversation that "
    "no longer fits the context (code `context_length_exceeded`) or is past "
    "`max_conversation_mb` (code `conversation_too_large`).",
    403: "The key has `max_agents_per_key` agents and none can make room (code "
    "`agent_limit_reached`).",
    404: "No such agent (or not one of this key's).",
    409: "The agent id is taken, or the agent is generating (code `conflict`).",
    413: "The key's agents would keep more conversation text than "
    "`max_conversations_mb_per_key` (code `conversation_quota_exceeded`); a fork adds nothing "
    "until its conversation differs from its parent's.",
    500: "A fault in the server (the log has the details); or a disk write that failed (code "
    "`persist_failed`): then nothing was changed.",
}

# An admin names another key's agent by that key's owner digest (`none`: agents of no key).
OwnerParam = Annotated[
    str | None,
    Query(
        pattern=f"^({OWNER_PATTERN.pattern}|{UNOWNED})$",
        description="For an admin key: the owner of the agent meant (an agent's `owner`, or "
        "`none`); by default the caller's own.",
    ),
]


def _errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """The errors a route answers, in the OpenAI shape the agent API speaks (`api/errors.py`);
    any route may fail with a 500."""
    return {
        status: {"model": OpenAIError, "description": _ERROR_TEXT[status]}
        for status in (*statuses, 500)
    }


class ConversationSummary(BaseModel):
    """A conversation's size, never its text: `GET /v1/agents/{agent_id}/messages` reads that."""

    defaults: dict[str, Any]
    messages: int
    text_bytes: int = Field(description="Its system prompt and messages, in UTF-8 bytes.")


class AgentInfo(BaseModel):
    """An agent and its cache statistics (`Agents.describe`)."""

    agent_id: str
    owner: str | None = Field(
        description="A digest of the API key whose agent it is (null on a server without "
        "keys, and for agents made before agents had owners)."
    )
    cached_tokens: int
    pinned: bool
    working: bool = Field(
        description="Heard from within agent_idle_s: mid-conversation (perhaps waiting on a "
        "tool), so its cache leaves memory after idle agents'. Not whether a turn runs now."
    )
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
    generating: bool = Field(description="A turn of it is running now.")
    conversation: ConversationSummary | None = Field(
        description="What the server keeps for generate; null for an agent that only chat "
        "requests named (its first generate starts an empty one)."
    )


class AgentList(BaseModel):
    """One page of agents in id order; pass `last_id` as `after` for the next."""

    object: str = "list"
    data: list[AgentInfo]
    first_id: str | None
    last_id: str | None
    has_more: bool


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
    "headers": CACHE_MISS_HEADER_DOC,
}


# -- routes -----------------------------------------------------------------------------------


@router.post(
    "/v1/agents",
    status_code=201,
    response_model=AgentInfo,
    responses=_errors(400, 403, 409, 413),
)
async def create_agent(request: Request, body: AgentCreate | None = None) -> dict[str, Any]:
    """Create an agent with a system prompt and sampling defaults; nothing is cached until its
    first generate. Of two creates of one id, exactly one wins (the other gets 409). It belongs
    to the key that creates it."""
    door, body = engine_of(request).agent_door, body or AgentCreate()
    agent_id = body.agent_id or _new_id()
    defaults = body.defaults.settings()
    limits.check_stops(request.app.state.settings, defaults.stop or (), "defaults.stop")
    return await door.create(caller_of(request), agent_id, Conversation(body.system, defaults))


@router.get("/v1/agents", response_model=AgentList, responses=_errors(400))
async def list_agents(
    request: Request,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    after: Annotated[
        str | None, Query(pattern=AGENT_ID_PATTERN, description="The `last_id` of a page.")
    ] = None,
    owner: OwnerParam = None,
) -> dict[str, Any]:
    """The key's agents in id order (an admin key's: every key's, or `owner`'s), `limit` at a
    time: summaries, whose size does not grow with their conversations."""
    door = engine_of(request).agent_door
    page = await door.page(caller_of(request), limit, after, owner)
    ids = [agent["agent_id"] for agent in page.data]
    return {
        "object": "list",
        "data": page.data,
        "first_id": ids[0] if ids else None,
        "last_id": ids[-1] if ids else None,
        "has_more": page.has_more,
    }


@router.get("/v1/agents/{agent_id}", response_model=AgentInfo, responses=_errors(400, 404))
async def get_agent(agent_id: str, request: Request, owner: OwnerParam = None) -> dict[str, Any]:
    door, agent_id = engine_of(request).agent_door, _checked(agent_id)
    return await door.describe(caller_of(request), agent_id, owner)


@router.patch("/v1/agents/{agent_id}", response_model=AgentInfo, responses=_errors(400, 403, 404))
async def update_agent(
    agent_id: str, body: AgentUpdate, request: Request, owner: OwnerParam = None
) -> dict[str, Any]:
    """Pin (or unpin) an agent: a pinned agent's cache stays in memory and on disk. Durable
    once answered (its manifest is written); an unknown agent is a 404, a pin past the key's
    share of the pool a 403."""
    door, agent_id = engine_of(request).agent_door, _checked(agent_id)
    return await door.pin(caller_of(request), agent_id, body.pinned, owner)


@router.delete("/v1/agents/{agent_id}", response_model=Deleted, responses=_errors(400, 404, 409))
async def delete_agent(agent_id: str, request: Request, owner: OwnerParam = None) -> dict[str, Any]:
    """Forget the agent and its conversation; frees its blocks in memory and on disk that no
    other agent shares. Its id can be created again."""
    door, agent_id = engine_of(request).agent_door, _checked(agent_id)
    await door.delete(caller_of(request), agent_id, owner)
    return {"id": agent_id, "object": "agent", "deleted": True}


@router.post(
    "/v1/agents/{agent_id}/generate",
    response_model=Generation,
    responses={200: _JSON_OR_SSE, **_errors(400, 404, 409, 413)},
)
async def generate(
    agent_id: str, body: GenerateBody, request: Request, owner: OwnerParam = None
) -> Response:
    """One turn: the new user message after the agent's whole conversation, rendered through
    the chat template (the agent's cache serves what it has seen); the reply joins the
    conversation, on disk, before the answer (or the `done` event) goes out. One turn at a
    time per agent: 409 while another runs."""
    engine, agent_id, caller = engine_of(request), _checked(agent_id), caller_of(request)
    rate_limits.check_agent(request, agent_id)
    hold = engine.agent_door.hold(caller, agent_id, request.state.request_id, owner)
    turn = await Turn.begin(engine, hold, body.message)
    try:
        generation = await turn.request(body, request.app.state.settings)
        events, headers = await cache_miss.stream(engine, generation)
    except BaseException:
        turn.abandon()
        raise
    if body.stream:
        frames = after_the_200(turn.frames(events), events, error_event)
        keep_alive_s = request.app.state.settings.keep_alive_s
        return sse_response(with_keep_alive(frames, keep_alive_s), headers)
    try:
        answer = await unless_disconnected(request, turn.answer(events))
        return JSONResponse(answer, headers=headers)
    finally:
        turn.abandon()


@router.post(
    "/v1/agents/{agent_id}/fork",
    status_code=201,
    response_model=AgentInfo,
    responses=_errors(400, 403, 404, 409, 413),
)
async def fork_agent(
    agent_id: str, request: Request, body: AgentFork | None = None, owner: OwnerParam = None
) -> dict[str, Any]:
    """A new agent with this one's conversation, sharing it and its cache: the conversation is
    stored once for both, and no block is copied until one of them extends the shared partial
    last block. The new agent is the caller's."""
    door, parent = engine_of(request).agent_door, _checked(agent_id)
    child = (body.agent_id if body else None) or _new_id()
    return await door.fork(caller_of(request), parent, child, owner)


@router.post("/v1/agents/{agent_id}/persist", response_model=Persisted, responses=_errors(400, 404))
async def persist_agent(
    agent_id: str, request: Request, owner: OwnerParam = None
) -> dict[str, Any]:
    """Write the agent's cache and conversation to disk; answers once they are fsynced."""
    door, agent_id = engine_of(request).agent_door, _checked(agent_id)
    result = await door.persist(caller_of(request), agent_id, owner)
    if result.failed or result.agents_failed:
        raise PersistFailed(
            f"agent {agent_id!r} is not durable: {result.failed} block writes failed, or its "
            "manifest could not be written (see the server log)"
        )
    return {"agent_id": agent_id, "blocks_written": result.blocks_written, "durable": True}


@router.get(
    "/v1/agents/{agent_id}/messages", response_model=MessageList, responses=_errors(400, 404)
)
async def agent_messages(
    agent_id: str, request: Request, owner: OwnerParam = None
) -> dict[str, Any]:
    """The conversation the server keeps for the agent, oldest message first: the one route
    that carries its text (at most `max_conversation_mb` of it)."""
    door, agent_id = engine_of(request).agent_door, _checked(agent_id)
    conversation = await door.conversation(caller_of(request), agent_id, owner)
    data = [{"role": m.role, "content": m.content} for m in conversation.messages]
    return {"object": "list", "agent_id": agent_id, "system": conversation.system, "data": data}


def _new_id() -> str:
    return f"agent_{uuid.uuid4().hex[:24]}"
