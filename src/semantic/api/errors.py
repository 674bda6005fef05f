"""Every error, in the shape and status of the protocol the client speaks.

The one place that maps `semantic.errors` (and FastAPI's own validation and routing errors)
onto HTTP. Routes raise; the handlers installed here answer.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from semantic import errors
from semantic.api.streaming import ClientGone

log = logging.getLogger(__name__)

# (status, OpenAI type, OpenAI code) for each of our errors; the most specific class wins.
_STATUS: list[tuple[type[Exception], int, str, str | None]] = [
    (errors.ContextOverflow, 400, "invalid_request_error", "context_length_exceeded"),
    (errors.InvalidRequest, 400, "invalid_request_error", None),
    (errors.PoolExhausted, 400, "invalid_request_error", "context_length_exceeded"),
    (errors.NotFound, 404, "invalid_request_error", "model_not_found"),
    (errors.Overloaded, 503, "server_error", "overloaded"),
]
_HTTP_TYPES = {401: "authentication_error", 403: "permission_error", 404: "not_found_error"}


def openai_error(
    status: int, message: str, type_: str, param: str | None = None, code: str | None = None
) -> JSONResponse:
    body = {"error": {"message": message, "type": type_, "param": param, "code": code}}
    return JSONResponse(body, status_code=status)


def classify(exc: Exception) -> tuple[int, str, str | None]:
    """(HTTP status, OpenAI error type, code) for an exception."""
    for cls, status, type_, code in _STATUS:
        if isinstance(exc, cls):
            return status, type_, code
    return 500, "server_error", None


def error_payload(exc: Exception) -> dict[str, Any]:
    """The body of a mid-stream OpenAI error chunk."""
    _, type_, code = classify(exc)
    return {"error": {"message": str(exc), "type": type_, "param": None, "code": code}}


def _validation_message(exc: RequestValidationError) -> str:
    first = exc.errors()[0]
    if first.get("type") == "json_invalid":
        return "the request body is not valid JSON"
    location = ".".join(str(part) for part in first.get("loc", ()) if part != "body")
    return f"{location}: {first.get('msg')}" if location else str(first.get("msg"))


def install(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        return openai_error(400, _validation_message(exc), "invalid_request_error")

    @app.exception_handler(json.JSONDecodeError)
    async def _not_json(request: Request, exc: json.JSONDecodeError) -> JSONResponse:
        return openai_error(400, "the request body is not valid JSON", "invalid_request_error")

    @app.exception_handler(HTTPException)
    async def _http(request: Request, exc: HTTPException) -> JSONResponse:
        type_ = _HTTP_TYPES.get(exc.status_code, "invalid_request_error")
        return openai_error(exc.status_code, str(exc.detail), type_)

    @app.exception_handler(errors.SemanticError)
    async def _ours(request: Request, exc: errors.SemanticError) -> JSONResponse:
        status, type_, code = classify(exc)
        param = exc.param if isinstance(exc, errors.InvalidRequest) else None
        return openai_error(status, str(exc), type_, param, code)

    @app.exception_handler(ClientGone)
    async def _gone(request: Request, exc: ClientGone) -> JSONResponse:
        return openai_error(499, "client closed the request", "invalid_request_error")

    @app.exception_handler(Exception)
    async def _bug(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return openai_error(500, "internal server error", "server_error")
