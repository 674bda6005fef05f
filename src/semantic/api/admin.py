"""Operations endpoints: health, metrics, the cache's statistics and persistence, and the
model swap."""

from __future__ import annotations

import asyncio
from dataclasses import asdict
from typing import Annotated, Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel, ConfigDict, Field

from semantic.api.auth import caller_of
from semantic.api.bodies import LimitedBodyRoute
from semantic.api.errors import AnthropicError, OpenAIError
from semantic.api.gate import engine_of
from semantic.api.lifecycle import Lifecycle
from semantic.cache.agents.manifest import OWNER_PATTERN, UNOWNED
from semantic.core import AGENT_ID_PATTERN
from semantic.engine.host import EngineHost
from semantic.errors import SemanticError
from semantic.observability import EngineReading, Metrics, ReplicasReading

router = APIRouter(route_class=LimitedBodyRoute)  # bodies under `max_body_mb`, as everywhere

READ_TIMEOUT_S = 5.0  # for the engine's state in a scrape (Prometheus gives up after 10 s)


@router.get("/health/live")
async def live() -> dict[str, str]:
    """200 while the process runs (its event loop answers), whatever else is going on."""
    return {"status": "alive"}


@router.get("/health/startup")
async def startup(request: Request) -> Response:
    """200 once the model is loaded and the engine started, and from then on; 503 before."""
    lifecycle: Lifecycle = request.app.state.lifecycle
    status, code = ("started", 200) if lifecycle.started else ("starting", 503)
    return JSONResponse({"status": status, "phase": lifecycle.phase}, status_code=code)


@router.get("/health/ready")
async def ready(request: Request) -> Response:
    """200 when a request would be served now: serving (not starting or draining), a model
    loaded (no swap running) and its engine thread, which owns the KV pool, alive. Otherwise
    503 with the reason. Both carry the pool's state when there is an engine."""
    lifecycle: Lifecycle = request.app.state.lifecycle
    engine, reason = lifecycle.engine, lifecycle.not_ready()
    body: dict[str, Any] = {"phase": lifecycle.phase}
    if engine is not None:
        body |= {"model": engine.model.name, **engine.state()}
    if reason is not None:
        return JSONResponse({"status": "not ready", "reason": reason, **body}, status_code=503)
    return JSONResponse({"status": "ready", **body})


@router.get(
    "/metrics",
    response_class=Response,
    responses={200: {"content": {CONTENT_TYPE_LATEST: {"schema": {"type": "string"}}}}},
)
async def metrics(request: Request) -> Response:
    """Prometheus metrics (docs/operations.md lists them). The engine's state is read on its
    thread between steps; when it cannot be (no engine thread running, a model swap under
    way), the rest is shown without it, so a scrape never waits on a swap."""
    catalog: Metrics = request.app.state.metrics
    return Response(catalog.exposition(await _reading(request)), media_type=CONTENT_TYPE_LATEST)


async def _reading(request: Request) -> EngineReading | ReplicasReading | None:
    try:
        engine = engine_of(request)
    except SemanticError:  # no model loaded, mid-swap
        return None
    try:
        # An engine a swap stops right now refuses the call (Unavailable); the timeout is for a
        # thread that stopped answering.
        return await asyncio.wait_for(engine.reading(), READ_TIMEOUT_S)
    except (TimeoutError, SemanticError):
        return None


@router.get("/admin/cache")
async def cache_stats(request: Request) -> dict[str, Any]:
    """Cache totals (hit and miss tokens by tier, evictions, disk use) and every agent the key
    may see (an admin key: all)."""
    engine = engine_of(request)
    snapshot = await engine.agent_door.snapshot(caller_of(request))
    return {"pool": engine.state(), **snapshot}


class AgentsBody(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    agents: list[Annotated[str, Field(pattern=AGENT_ID_PATTERN)]] | None = Field(
        None, description="These agents' caches; all when absent."
    )
    owner: str | None = Field(
        None,
        pattern=f"^({OWNER_PATTERN.pattern}|{UNOWNED})$",
        description="Whose agents `agents` names (an agent's `owner`, or `none`); by default "
        "the caller's own. Another key's agents are found by an admin key only.",
    )


@router.post("/admin/cache/persist")
async def persist(request: Request, body: AgentsBody | None = None) -> dict[str, Any]:
    """Write hot caches to disk; answers only once they are fsynced."""
    body, door = body or AgentsBody(), engine_of(request).agent_door
    return asdict(await door.persist_many(caller_of(request), body.agents, body.owner))


@router.post("/admin/cache/evict")
async def evict(request: Request, body: AgentsBody | None = None) -> dict[str, Any]:
    """Move caches out of memory to disk: persist them, then free their blocks, but for those a
    running request holds or a pinned agent keeps. The next turn reads them back from disk."""
    body, door = body or AgentsBody(), engine_of(request).agent_door
    return asdict(await door.evict_many(caller_of(request), body.agents, body.owner))


class SwapBody(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    model: str = Field(
        min_length=1,
        description="An alias (built in, or from `model_alias`) or a local path: a GGUF file "
        "or a Hugging Face directory.",
    )


_SWAP_ERRORS: dict[int | str, dict[str, Any]] = {
    400: {
        "model": OpenAIError | AnthropicError,
        "description": "The body names no model, or the model did not load (code "
        "`model_load_failed`, the message says why) and the previous model serves again.",
    },
    404: {"model": OpenAIError | AnthropicError, "description": "No model by that alias or path."},
}


@router.post("/admin/models/swap", responses=_SWAP_ERRORS)
async def swap_model(body: SwapBody, request: Request) -> dict[str, Any]:
    """Serve another model. Running requests get `swap_timeout_s` to finish (then 503), caches
    are persisted, the old model is unloaded and the new one loaded; requests that arrive
    meanwhile wait. Answers with the time each part took. An unknown name is a 404; a model
    that fails to load is a 400 (`model_load_failed`), and the previous model serves again."""
    host: EngineHost = request.app.state.host
    return asdict(await host.swap(body.model))


@router.get("/admin/models")
async def models(request: Request) -> dict[str, Any]:
    """The model loaded now, the models a swap may name by alias, and the last swap."""
    host: EngineHost = request.app.state.host
    loaded = host.source
    return {
        "state": host.state,
        "loaded": None if host.state != "serving" else _loaded_model(host),
        "registered": [
            {
                "name": source.name,
                "aliases": list(source.aliases),
                "format": source.format,
                "path": str(source.path),
                "loaded": loaded is not None and host.is_loaded(source),
            }
            for source in host.registry.available()
        ],
        "swap_on_request": host.settings.swap_on_request,
        "last_swap": None if host.last_swap is None else asdict(host.last_swap),
    }


def _loaded_model(host: EngineHost) -> dict[str, Any]:
    engine, source = host.engine, host.source
    return {
        "id": engine.model.name,
        "aliases": list(engine.model.aliases),
        "path": None if source is None else str(source.path),
        "context_length": engine.model.context_length,
        "cache_spec": engine.cache_spec_tag(),
    }
