"""The OpenAPI document at /openapi.json, true to what the routes do.

FastAPI documents what it sees: the bodies it parses, a 200, and a 422 for validation. Routes
add what it cannot see with the helpers here (`json_body` for a body read by hand,
`error_responses` for the errors they answer, `STREAMED_OR_JSON`); `install` then moves the
hand-read bodies' schemas into the components, and replaces the 422 this app never sends (its
validation errors are 400s in each protocol's shape, errors.py), and adds the 401 it does send
when API keys are set (auth.py), the admin routes' 403 when admin keys are, and the 429 when
rate limits are (rate_limits.py), or keys (too many wrong ones from one address).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel

from semantic.api.auth import ADMIN_PATHS, OPEN_PATHS
from semantic.api.cache_miss import CACHE_MISS_HEADER_DOC
from semantic.api.errors import AnthropicError, OpenAIError, Protocol

_SCHEMAS = "x-semantic-schemas"  # where `json_body` leaves its schemas for `install` to move
_REF = "#/components/schemas/{name}"
_METHODS = frozenset({"get", "put", "post", "delete", "options", "head", "patch", "trace"})

_ERROR_DESCRIPTIONS = {
    400: "The request is malformed (the message names the field), or does not fit the context.",
    401: "No API key, or an unknown one.",
    403: "An admin route with a key that is not an admin key (once `admin_api_key` is set).",
    404: "The model named is not served here (only with `strict_model_names`).",
    413: "The body is larger than `max_body_mb` (32 MiB unless set).",
    429: "Over a rate limit (`rate_limit_key_rpm`, `rate_limit_agent_rpm`), or too many wrong "
    "API keys from this address (`auth_failures_per_minute`); `retry-after` says when to try "
    "again.",
    500: "A fault in the server; the log has the details.",
    503: "Overloaded: no room in the KV pool within `queue_timeout_s`, or a model swap not done "
    "within `swap_wait_s`; retry later.",
    529: "Overloaded: no room in the KV pool within `queue_timeout_s`, or a model swap not done "
    "within `swap_wait_s`; retry later.",
}

# One server-sent event: before OpenAPI 3.2, a `text/event-stream` schema describes each event.
SSE_EVENT: dict[str, Any] = {
    "type": "object",
    "properties": {"event": {"type": "string"}, "data": {"type": "string"}},
    "required": ["data"],
}
STREAMED_OR_JSON: dict[str, Any] = {
    "description": "The answer as JSON, or with `stream: true` as server-sent events.",
    "content": {"text/event-stream": {"schema": SSE_EVENT}},
    "headers": CACHE_MISS_HEADER_DOC,
}


def error_responses(protocol: Protocol | None, *statuses: int) -> dict[int | str, dict[str, Any]]:
    """The `responses` a route declares for the errors it answers: each in `protocol`'s shape,
    or in either on the routes both APIs share (None)."""
    shapes: dict[Protocol | None, Any] = {
        "openai": OpenAIError,
        "anthropic": AnthropicError,
        None: OpenAIError | AnthropicError,
    }
    return {
        status: {"model": shapes[protocol], "description": _ERROR_DESCRIPTIONS[status]}
        for status in statuses
    }


def json_body(model: type[BaseModel], prefix: str) -> dict[str, Any]:
    """`openapi_extra` for a route that reads its body by hand: `model` as its required JSON
    body. Its schemas are named `prefix` + their model's name, so that two APIs' models of the
    same name (a `Tool`) stay apart."""
    reference = {"$ref": _REF.format(name=prefix + model.__name__)}
    return {
        "requestBody": {"required": True, "content": {"application/json": {"schema": reference}}},
        _SCHEMAS: _schemas_of(model, prefix),
    }


def _schemas_of(model: type[BaseModel], prefix: str = "") -> dict[str, Any]:
    """The component schemas of `model` and of the models it holds, by (prefixed) name."""
    schema = model.model_json_schema(ref_template=_REF.format(name=prefix + "{model}"))
    schemas = {prefix + name: definition for name, definition in schema.pop("$defs", {}).items()}
    return schemas | {prefix + model.__name__: schema}


def install(app: FastAPI) -> None:
    """Serve FastAPI's document made true (each time FastAPI makes it: it regenerates it when
    the routes change)."""
    generate = app.openapi
    settings = app.state.settings
    keys_required = settings.any_api_keys
    # With keys, a client address that sends too many wrong ones is limited too.
    rate_limited = bool(
        settings.rate_limit_key_rpm or settings.rate_limit_agent_rpm or keys_required
    )
    admin_keys = bool(settings.admin_api_keys)

    def openapi() -> dict[str, Any]:
        return made_true(generate(), keys_required, rate_limited, admin_keys)

    app.openapi = openapi  # type: ignore[method-assign]


def made_true(
    document: dict[str, Any],
    keys_required: bool,
    rate_limited: bool = False,
    admin_keys: bool = False,
) -> dict[str, Any]:
    """`document`, changed in place as the module docstring says (idempotent)."""
    components = document.setdefault("components", {})
    schemas = components.setdefault("schemas", {})
    for path, operation in _operations(document):
        for name, schema in operation.pop(_SCHEMAS, {}).items():
            if schemas.setdefault(name, schema) != schema:
                raise RuntimeError(f"two different schemas are named {name!r}")
        responses = operation["responses"]
        # A route that declares its errors is believed; any other answers a failed validation
        # with a 400 (errors.py), in the shape of the protocol the client speaks.
        declares = any(status[0] in "45" for status in responses if status != "422")
        if responses.pop("422", None) is not None and not declares:
            responses["400"] = _either(400, schemas)
        if keys_required and not path.startswith(OPEN_PATHS):
            responses.setdefault("401", _either(401, schemas))
            operation["security"] = [{"bearer": []}, {"apiKey": []}]
        if admin_keys and path.startswith(ADMIN_PATHS):
            responses.setdefault("403", _either(403, schemas))
        if rate_limited and not path.startswith(OPEN_PATHS):
            responses.setdefault("429", _either(429, schemas))
    for unused in ("HTTPValidationError", "ValidationError"):
        schemas.pop(unused, None)
    if keys_required:
        components["securitySchemes"] = {
            "bearer": {"type": "http", "scheme": "bearer"},
            "apiKey": {"type": "apiKey", "in": "header", "name": "x-api-key"},
        }
    return document


def _either(status: int, schemas: dict[str, Any]) -> dict[str, Any]:
    """A response of this status in either protocol's error shape (the routes both share)."""
    for model in (OpenAIError, AnthropicError):
        for name, schema in _schemas_of(model).items():
            schemas.setdefault(name, schema)
    shapes = [{"$ref": _REF.format(name=model.__name__)} for model in (OpenAIError, AnthropicError)]
    return {
        "description": _ERROR_DESCRIPTIONS[status],
        "content": {"application/json": {"schema": {"anyOf": shapes}}},
    }


def _operations(document: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    for path, item in document.get("paths", {}).items():
        for method, operation in item.items():
            if method in _METHODS:
                yield path, operation
