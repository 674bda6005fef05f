"""The direct agent API under /v1/agents: list, inspect and delete agents and their caches;
and how a request of any API names its agent (`named_agent`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict

from semantic.api.admin import engine_of
from semantic.core import AGENT_ID_PATTERN, is_valid_agent_id
from semantic.errors import InvalidRequest, NotFound

router = APIRouter()

SESSION_HEADER = "x-session-id"


def named_agent(
    headers: Mapping[str, str], name: str | None = None, param: str = SESSION_HEADER
) -> str | None:
    """The agent a request names explicitly, in any API: `name` (the body's own field, such as
    OpenAI's `session_id`), else the `x-session-id` header; None when it names none, and then
    prefix reuse finds its cache by content. A name that is not a valid agent id is a 400."""
    agent_id = name if name is not None else headers.get(SESSION_HEADER)
    if agent_id is not None and not is_valid_agent_id(agent_id):
        raise InvalidRequest(f"{param} must match {AGENT_ID_PATTERN}", param=param)
    return agent_id


def _checked(agent_id: str) -> str:
    if not is_valid_agent_id(agent_id):
        raise InvalidRequest(f"invalid agent id {agent_id[:40]!r}", param="agent_id")
    return agent_id


@router.get("/v1/agents")
async def list_agents(request: Request) -> dict[str, Any]:
    engine = engine_of(request)
    snapshot: dict[str, Any] = await engine.call(engine.store.snapshot)
    return {"object": "list", "data": snapshot["agents"]}


@router.get("/v1/agents/{agent_id}")
async def get_agent(agent_id: str, request: Request) -> dict[str, Any]:
    engine, agent_id = engine_of(request), _checked(agent_id)
    described: dict[str, Any] | None = await engine.call(lambda: engine.store.describe(agent_id))
    if described is None:
        raise NotFound(f"no agent {agent_id!r}")
    return described


class AgentUpdate(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    pinned: bool


@router.patch("/v1/agents/{agent_id}")
async def update_agent(agent_id: str, body: AgentUpdate, request: Request) -> dict[str, Any]:
    """Pin (or unpin) an agent: a pinned agent's cache never leaves memory or disk."""
    engine, agent_id = engine_of(request), _checked(agent_id)

    def apply() -> dict[str, Any] | None:
        engine.store.pin(agent_id, body.pinned)
        return engine.store.describe(agent_id)

    described: dict[str, Any] | None = await engine.call(apply)
    assert described is not None
    return described


@router.delete("/v1/agents/{agent_id}")
async def delete_agent(agent_id: str, request: Request) -> dict[str, Any]:
    """Forget the agent; frees its blocks in memory and on disk that no other agent shares."""
    engine, agent_id = engine_of(request), _checked(agent_id)
    if not await engine.call(lambda: engine.store.delete(agent_id)):
        raise NotFound(f"no agent {agent_id!r}")
    return {"id": agent_id, "object": "agent", "deleted": True}
