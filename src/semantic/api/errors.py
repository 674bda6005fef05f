"""Every error, in the shape and status of the protocol the client speaks.

The one place that maps `semantic.errors` (and FastAPI's own validation and routing errors)
onto HTTP, and the one place that decides which protocol a request speaks (`protocol_of`).
Routes raise; the handlers installed here answer.
"""

from __future__ import annotations

import json
import logging
import math
import re
import uuid
from collections.abc import Sequence
from http import HTTPStatus
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException
from starlette.routing import BaseRoute, Match

from semantic import errors
from semantic.api.streaming import ClientGone

log = logging.getLogger(__name__)

Protocol = Literal["anthropic", "openai"]

# (status, OpenAI type, OpenAI code) for each of our errors; the most specific class wins.
_STATUS: list[tuple[type[Exception], int, str, str | None]] = [
    (errors.ContextOverflow, 400, "invalid_request_error", "context_length_exceeded"),
    (errors.PreviousResponseNotFound, 400, "invalid_request_error", "previous_response_not_found"),
    (errors.ConversationTooLarge, 400, "invalid_request_error", "conversation_too_large"),
    (errors.RequestTooLarge, 413, "invalid_request_error", "request_too_large"),
    (errors.InvalidRequest, 400, "invalid_request_error", "invalid_request"),
    (errors.PoolExhausted, 400, "invalid_request_error", "context_length_exceeded"),
    (errors.ModelNotFound, 404, "invalid_request_error", "model_not_found"),
    (errors.NotFound, 404, "invalid_request_error", "not_found"),
    (errors.Conflict, 409, "invalid_request_error", "conflict"),
    (errors.TooManyAgents, 403, "invalid_request_error", "agent_limit_reached"),
    (errors.ConversationQuotaExceeded, 413, "invalid_request_error", "conversation_quota_exceeded"),
    (errors.PinLimit, 403, "invalid_request_error", "pin_limit_reached"),
    (errors.RetentionLimit, 403, "invalid_request_error", "retention_limit_reached"),
    # OpenAI's own type and code for a requests-per-minute limit.
    (errors.RateLimited, 429, "requests", "rate_limit_exceeded"),
    # A model swap to a model that does not load: the previous model serves again.
    (errors.ModelLoadFailed, 400, "invalid_request_error", "model_load_failed"),
    (errors.PersistFailed, 500, "server_error", "persist_failed"),
    (errors.NotSupported, 501, "invalid_request_error", "not_supported"),
    (errors.Overloaded, 503, "server_error", "overloaded"),
    (errors.Unavailable, 503, "server_error", "unavailable"),
]
INTERNAL = "internal server error"  # all a client learns of a fault: the log has the rest
_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")
_HTTP_TYPES = {401: "authentication_error", 403: "permission_error", 404: "not_found_error"}
# The code of a 4xx whose cause names none of its own.
_CODES = {
    400: "invalid_request",
    401: "invalid_api_key",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    409: "conflict",
    413: "request_too_large",
    415: "unsupported_media_type",
    429: "rate_limit_exceeded",
    499: "client_closed_request",
}

# Anthropic's statuses differ from OpenAI's only for overload (529, which its SDKs retry).
_ANTHROPIC_STATUS = {503: 529}
# Anthropic's error type for each status; other 4xx are invalid requests.
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    504: "timeout_error",
    529: "overloaded_error",
}


# The routes of OpenAI's APIs and of the agent API (whose stream errors are OpenAI's too): their
# errors are OpenAI's whatever headers a client (or a gateway forwarding them) sends.
_OPENAI_ROUTES = ("/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/agents")


def protocol_of(request: Request) -> Protocol:
    """Anthropic for `/v1/messages…`, and for the routes both APIs share (`/v1/models…`), the
    admin routes, or no route at all when the client looks like an Anthropic SDK (it always
    sends `anthropic-version`; `x-api-key` is its key header). OpenAI otherwise."""
    path, headers = request.url.path, request.headers
    if _under(path, "/v1/messages"):
        return "anthropic"
    if any(_under(path, route) for route in _OPENAI_ROUTES):
        return "openai"
    if _under(path, "/v1/models"):
        anthropic = "anthropic-version" in headers or "x-api-key" in headers
        return "anthropic" if anthropic else "openai"
    return "anthropic" if "anthropic-version" in headers else "openai"


def _under(path: str, route: str) -> bool:
    return path == route or path.startswith(route + "/")


class OpenAIErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class OpenAIError(BaseModel):
    """OpenAI's error body; the OpenAPI document shows this model."""

    error: OpenAIErrorDetail


class AnthropicErrorDetail(BaseModel):
    type: str
    message: str


class AnthropicError(BaseModel):
    """Anthropic's error body; the OpenAPI document shows this model."""

    type: Literal["error"]
    error: AnthropicErrorDetail
    request_id: str


def openai_error(
    status: int, message: str, type_: str, param: str | None = None, code: str | None = None
) -> JSONResponse:
    """OpenAI's error shape. Every 4xx carries a code a client can branch on: the one given,
    else its status's."""
    if code is None and 400 <= status < 500:
        code = _CODES.get(status, "invalid_request")
    detail = OpenAIErrorDetail(message=message, type=type_, param=param, code=code)
    return JSONResponse(OpenAIError(error=detail).model_dump(), status_code=status)


def anthropic_error(request: Request, status: int, message: str) -> JSONResponse:
    request_id = getattr(request.state, "request_id", None) or f"req_{uuid.uuid4().hex}"
    detail = AnthropicErrorDetail(type=anthropic_type(status), message=message)
    body = AnthropicError(type="error", error=detail, request_id=request_id)
    # Repeated in the header, which the middleware cannot add to a 500 (it runs outside it).
    return JSONResponse(body.model_dump(), status_code=status, headers={"request-id": request_id})


def error_response(
    request: Request,
    status: int,
    message: str,
    code: str | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    """An error of HTTP `status` in the request's protocol, its type the one the protocol gives
    that status (OpenAI: `code`, when given, says which refusal it is)."""
    if protocol_of(request) == "anthropic":
        response = anthropic_error(request, status, message)
    else:
        fallback = "server_error" if status >= 500 else "invalid_request_error"
        response = openai_error(status, message, _HTTP_TYPES.get(status, fallback), code=code)
    response.headers.update(headers or {})
    return response


def anthropic_type(status: int) -> str:
    return _ANTHROPIC_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")


def classify(exc: Exception) -> tuple[int, str, str | None]:
    """(HTTP status, OpenAI error type, code) for an exception."""
    for cls, status, type_, code in _STATUS:
        if isinstance(exc, cls):
            return status, type_, code
    return 500, "server_error", None


def error_payload(exc: Exception) -> dict[str, Any]:
    """The body of a mid-stream OpenAI error chunk (the agent API's too). An exception of ours
    says what went wrong; any other is a fault whose text (paths, internals) stays in the log,
    where the stream's code put it."""
    _, type_, code = classify(exc)
    message = str(exc) if isinstance(exc, errors.SemanticError) else INTERNAL
    return {"error": {"message": message, "type": type_, "param": None, "code": code}}


def anthropic_status(exc: Exception) -> int:
    status = classify(exc)[0]
    if isinstance(exc, errors.Unavailable):  # not overload: 503 in both protocols
        return status
    return _ANTHROPIC_STATUS.get(status, status)


def anthropic_message(exc: Exception) -> str:
    """Our message, except for context overflow: Claude Code recognises Anthropic's own
    wording (`prompt is too long`) and compacts the conversation instead of failing."""
    if not isinstance(exc, errors.ContextOverflow):
        return str(exc) if isinstance(exc, errors.SemanticError) else INTERNAL
    prompt, output, context = exc.prompt_tokens, exc.max_tokens, exc.context_length
    if prompt >= context:
        # The longest prompt that still leaves room for one output token.
        return f"prompt is too long: {prompt} tokens > {context - 1} maximum"
    return (
        f"input length and `max_tokens` exceed context limit: {prompt} + {output} > {context}, "
        "decrease input length or `max_tokens` and try again"
    )


def anthropic_error_event(exc: Exception) -> dict[str, Any]:
    """The payload of a mid-stream Anthropic `error` event."""
    type_ = anthropic_type(anthropic_status(exc))
    return {"type": "error", "error": {"type": type_, "message": anthropic_message(exc)}}


# Parts of a pydantic error location that name a union branch, not a field: `str`,
# `list[...]`, a block tag ("text block"), or a model.
_BRANCHES = frozenset({"str", "int", "float", "bool", "dict", "list", "none"})


def _field_path(loc: Sequence[Any]) -> tuple[str, ...]:
    """The field a validation error is about, without where it came from (the body, the query
    string: `owner`, not `query.owner`)."""
    if loc and loc[0] in ("body", "query", "path"):
        loc = loc[1:]
    return tuple(str(part) for part in loc if not _is_branch(part))


def _is_branch(part: Any) -> bool:
    # Fields are snake_case; a model's branch is named after its class (`NamedToolChoice`).
    if not isinstance(part, str):
        return False
    return part in _BRANCHES or "[" in part or " " in part or part[:1].isupper()


def _validation_error(exc: RequestValidationError) -> tuple[str, str | None]:
    """(`field.path: what is wrong`, the field path) for both protocols. A value that fits no
    branch of a union (content: string or parts) gets one message naming them all; a value that
    fits a branch but is wrong inside it gets the deepest error, which is the one that says what
    to fix."""
    details = exc.errors()
    if details[0].get("type") == "json_invalid":
        return "the request body is not valid JSON", None
    found = [
        (_field_path(d.get("loc", ())), re.sub(r" or instance of \w++", "", str(d.get("msg"))))
        for d in details
    ]
    path = max((p for p, _ in found), key=len)
    if not path:  # the body itself: absent, or not an object
        missing = details[0].get("type") == "missing"
        return "the request body is " + ("empty" if missing else "not a JSON object"), None
    said = list(dict.fromkeys(message for p, message in found if p == path))
    message = said[0] + "".join(f" or {m.removeprefix('Input should be ')}" for m in said[1:])
    return f"{'.'.join(path)}: {message}", ".".join(path)


def semantic_error_response(request: Request, exc: errors.SemanticError) -> JSONResponse:
    """One of our errors in the request's protocol; also for middleware, which answers outside
    the handlers `install` sets."""
    if protocol_of(request) == "anthropic":
        response = anthropic_error(request, anthropic_status(exc), anthropic_message(exc))
    else:
        status, type_, code = classify(exc)
        param = exc.param if isinstance(exc, errors.InvalidRequest) else None
        response = openai_error(status, str(exc), type_, param, code)
    if isinstance(exc, errors.RateLimited):
        response.headers.update(retry_after_headers(exc.retry_after_s))
    return response


def retry_after_headers(seconds: float) -> dict[str, str]:
    """When to try again, as both SDK families read it: `retry-after` in whole seconds (at least
    1, rounded up, so a client that waits it is admitted), `retry-after-ms` exactly."""
    return {
        "retry-after": str(max(1, math.ceil(seconds))),
        "retry-after-ms": str(max(1, math.ceil(seconds * 1000))),
    }


def _no_route(request: Request, status: int) -> JSONResponse:
    """A 404 that names the path and says where the routes are; a 405 whose `Allow` lists the
    methods of every route at the path (the router's names only the first route's)."""
    path = request.url.path[:200]
    if status == 404:
        where = "the routes are listed at /docs and /openapi.json"
        message = f"no route {request.method} {path}: {where}"
        return error_response(request, 404, message, code="unknown_route")
    routes: list[BaseRoute] = request.app.router.routes
    allowed = [
        method
        for method in _METHODS
        if any(
            route.matches({**request.scope, "method": method})[0] is Match.FULL for route in routes
        )
    ]
    message = f"{path} takes {', '.join(allowed)}, not {request.method}"
    allow = {"Allow": ", ".join(allowed)}
    return error_response(request, 405, message, code="method_not_allowed", headers=allow)


def install(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = _validation_error(exc)
        if protocol_of(request) == "anthropic":
            return anthropic_error(request, 400, message)
        return openai_error(400, message, "invalid_request_error", param)

    @app.exception_handler(json.JSONDecodeError)
    async def _not_json(request: Request, exc: json.JSONDecodeError) -> JSONResponse:
        message = "the request body is not valid JSON"
        if protocol_of(request) == "anthropic":
            return anthropic_error(request, 400, message)
        return openai_error(400, message, "invalid_request_error")

    @app.exception_handler(HTTPException)
    async def _http(request: Request, exc: HTTPException) -> JSONResponse:
        if exc.status_code in (404, 405) and exc.detail == HTTPStatus(exc.status_code).phrase:
            return _no_route(request, exc.status_code)  # the router's own: no route matched
        response = error_response(request, exc.status_code, str(exc.detail))
        response.headers.update(exc.headers or {})
        return response

    @app.exception_handler(errors.SemanticError)
    async def _ours(request: Request, exc: errors.SemanticError) -> JSONResponse:
        return semantic_error_response(request, exc)

    @app.exception_handler(ClientGone)
    async def _gone(request: Request, exc: ClientGone) -> JSONResponse:
        if protocol_of(request) == "anthropic":
            return anthropic_error(request, 499, "client closed the request")
        return openai_error(499, "client closed the request", "invalid_request_error")

    @app.exception_handler(Exception)
    async def _bug(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return error_response(request, 500, INTERNAL)
