"""`GET /v1/models` and `GET /v1/models/{id}`, which both APIs have: a client speaking
Anthropic (by its headers: errors.py's `protocol_of`) gets Anthropic's shapes, any other
OpenAI's. One model is loaded; any name a client asks for is an alias of it (unless
`strict_model_names`)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, Request

from semantic.api.errors import protocol_of
from semantic.api.gate import engine_of
from semantic.api.openapi import error_responses
from semantic.errors import InvalidRequest

router = APIRouter()


@router.get("/v1/models", responses=error_responses(None, 400, 500))
async def list_models(request: Request) -> dict[str, Any]:
    if protocol_of(request) == "anthropic":
        return _anthropic_list(request)
    return {"object": "list", "data": [_openai_card(request)]}


@router.get("/v1/models/{model_id:path}", responses=error_responses(None, 404, 500))
async def get_model(model_id: str, request: Request) -> dict[str, Any]:
    engine = engine_of(request)
    engine.model.check_requested_name(model_id, request.app.state.settings.strict_model_names)
    if protocol_of(request) == "anthropic":
        return _anthropic_card(request, model_id)
    return _openai_card(request) | {"id": model_id}


def _openai_card(request: Request) -> dict[str, Any]:
    engine = engine_of(request)
    return {
        "id": engine.model.name,
        "object": "model",
        "created": int(request.app.state.started_at),
        "owned_by": "semantic",
        "max_model_len": engine.max_seq_tokens,
    }


def _anthropic_list(request: Request) -> dict[str, Any]:
    """Anthropic's paginated list (`limit`, `after_id`, `before_id`) of the one loaded model."""
    limit = _limit(request.query_params.get("limit"))
    ids = [engine_of(request).model.name]
    after, before = request.query_params.get("after_id"), request.query_params.get("before_id")
    if after in ids:
        ids = ids[ids.index(after) + 1 :]
    if before in ids:
        ids = ids[: ids.index(before)]
    page = ids[:limit]
    return {
        "data": [_anthropic_card(request, model_id) for model_id in page],
        "has_more": len(ids) > limit,
        "first_id": page[0] if page else None,
        "last_id": page[-1] if page else None,
    }


def _anthropic_card(request: Request, model_id: str) -> dict[str, Any]:
    """The loaded model under `model_id`: any name a client asks for is an alias of it."""
    engine = engine_of(request)
    started = datetime.fromtimestamp(request.app.state.started_at, UTC)
    return {
        "type": "model",
        "id": model_id,
        "display_name": engine.model.name,
        "created_at": started.strftime("%Y-%m-%dT%H:%M:%SZ"),
        # One sequence's limit: the context, or less when the KV pool is smaller.
        "max_input_tokens": engine.max_seq_tokens - 1,
        "max_tokens": engine.max_seq_tokens - 1,
    }


def _limit(value: str | None) -> int:
    if value is None:
        return 20
    if not value.isdigit() or not 1 <= int(value) <= 1000:
        raise InvalidRequest(f"limit: must be an integer from 1 to 1000, not {value[:20]!r}")
    return int(value)
