"""Operations endpoints: health, and the cache's statistics and persistence."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict

from semantic.engine.engine import Engine

router = APIRouter()


def engine_of(request: Request) -> Engine:
    engine: Engine = request.app.state.engine
    return engine


@router.get("/health/live")
async def live() -> dict[str, str]:
    return {"status": "alive"}


@router.get("/health/ready")
async def ready(request: Request) -> Response:
    engine = engine_of(request)
    body: dict[str, Any] = {"model": engine.model.name, **asdict(engine.stats())}
    if not engine.alive:
        return JSONResponse({"status": "not ready", **body}, status_code=503)
    return JSONResponse({"status": "ready", **body})


@router.get("/admin/cache")
async def cache_stats(request: Request) -> dict[str, Any]:
    """Cache totals (hit and miss tokens by tier, evictions, disk use) and every agent."""
    engine = engine_of(request)
    snapshot: dict[str, Any] = await engine.call(engine.store.snapshot)
    return {"pool": asdict(engine.stats()), **snapshot}


class PersistBody(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    agents: list[str] | None = None


@router.post("/admin/cache/persist")
async def persist(request: Request, body: PersistBody | None = None) -> dict[str, Any]:
    """Write hot caches to disk; answers only once they are fsynced."""
    result = await engine_of(request).persist(body.agents if body else None)
    return asdict(result)
