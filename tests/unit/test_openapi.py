"""/openapi.json tells the truth: every route with its methods, the request bodies routes read
(by FastAPI or by hand), the statuses they answer, and a document whose references all resolve."""

from __future__ import annotations

import inspect
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient
from starlette.routing import BaseRoute

from semantic.models.served import ServedModel
from tests.unit.fakes import chat_app

METHODS = {"get", "put", "post", "delete", "options", "head", "patch", "trace"}
# The bodies of the protocol routes, by component name, and the fields each requires.
BODIES = {
    ("/v1/chat/completions", "post"): ("ChatCompletionRequest", {"model", "messages"}),
    ("/v1/completions", "post"): ("CompletionRequest", {"model", "prompt"}),
    ("/v1/messages", "post"): ("AnthropicMessagesBody", {"model", "messages", "max_tokens"}),
    ("/v1/messages/count_tokens", "post"): ("AnthropicPromptBody", {"model", "messages"}),
}
# What the protocol routes answer besides 200; all of it, and nothing they never send.
ERRORS = {
    ("/v1/chat/completions", "post"): {"400", "404", "413", "500", "503"},
    ("/v1/completions", "post"): {"400", "404", "413", "500", "503"},
    ("/v1/messages", "post"): {"400", "404", "413", "500", "529"},
    ("/v1/messages/count_tokens", "post"): {"400", "404", "413", "500"},
    ("/v1/models", "get"): {"400", "500"},
    ("/v1/models/{model_id}", "get"): {"404", "500"},
}
# How an endpoint reads its body when FastAPI does not.
HAND_READ = ("parse_body(", "request.body(", "request.json(", "request.stream(")


@pytest.fixture
def api(served: ServedModel, tmp_path: Path) -> Iterator[TestClient]:
    with chat_app(served, tmp_path) as client:
        yield client


@pytest.fixture
def document(api: TestClient) -> dict[str, Any]:
    response = api.get("/openapi.json")
    assert response.status_code == 200
    return dict(response.json())


def routes_of(routes: Iterable[BaseRoute]) -> Iterator[BaseRoute]:
    """Every route, through included routers (newer FastAPI keeps them nested)."""
    for route in routes:
        inner = getattr(route, "original_router", None)
        yield from routes_of(inner.routes) if inner is not None else [route]


def api_routes(api: TestClient) -> list[APIRoute]:
    routes = routes_of(api.app.routes)  # type: ignore[attr-defined]
    return [r for r in routes if isinstance(r, APIRoute) and r.include_in_schema]


def operations(document: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    for path, item in document["paths"].items():
        for method, operation in item.items():
            yield path, method, operation


def resolve(document: dict[str, Any], reference: str) -> Any:
    assert reference.startswith("#/"), reference
    node: Any = document
    for part in reference[2:].split("/"):
        node = node[part.replace("~1", "/").replace("~0", "~")]
    return node


def references(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref":
                yield value
            else:
                yield from references(value)
    elif isinstance(node, list):
        for value in node:
            yield from references(value)


def test_every_route_appears_with_each_of_its_methods(
    api: TestClient, document: dict[str, Any]
) -> None:
    routes = api_routes(api)
    assert len(routes) >= 12
    documented = {(path, method) for path, method, _ in operations(document)}
    expected = {(r.path_format, m.lower()) for r in routes for m in r.methods or ()}
    assert documented == expected
    assert set(BODIES) | set(ERRORS) <= documented


def test_every_body_a_route_reads_is_documented(api: TestClient, document: dict[str, Any]) -> None:
    for route in api_routes(api):
        by_hand = any(call in inspect.getsource(route.endpoint) for call in HAND_READ)
        if route.body_field is None and not by_hand:
            continue
        for method in route.methods or ():
            operation = document["paths"][route.path_format][method.lower()]
            schema = operation["requestBody"]["content"]["application/json"]["schema"]
            # A model, or (an optional body) a model or null.
            [model] = list(references(schema))
            assert resolve(document, model)["type"] == "object", route.path_format


def test_the_protocol_routes_document_their_bodies_and_what_they_require(
    document: dict[str, Any],
) -> None:
    for (path, method), (name, required) in BODIES.items():
        body = document["paths"][path][method]["requestBody"]
        assert body["required"] is True
        schema = body["content"]["application/json"]["schema"]
        assert schema == {"$ref": f"#/components/schemas/{name}"}
        assert set(resolve(document, schema["$ref"])["required"]) == required, path


def test_the_protocol_routes_document_the_statuses_they_answer(document: dict[str, Any]) -> None:
    error_shapes = {
        "/v1/chat/completions": {"OpenAIError"},
        "/v1/completions": {"OpenAIError"},
        "/v1/messages": {"AnthropicError"},
        "/v1/messages/count_tokens": {"AnthropicError"},
        "/v1/models": {"OpenAIError", "AnthropicError"},  # both APIs share the model routes
        "/v1/models/{model_id}": {"OpenAIError", "AnthropicError"},
    }
    for (path, method), errors in ERRORS.items():
        responses = document["paths"][path][method]["responses"]
        assert set(responses) == {"200", *errors}, path
        for status in errors:
            schema = responses[status]["content"]["application/json"]["schema"]
            names = {reference.rsplit("/", 1)[1] for reference in references(schema)}
            assert names == error_shapes[path], (path, status)
    for path in ("/v1/chat/completions", "/v1/completions", "/v1/messages"):
        assert "text/event-stream" in document["paths"][path]["post"]["responses"]["200"]["content"]


def test_no_route_documents_the_422_this_app_never_sends(document: dict[str, Any]) -> None:
    for path, method, operation in operations(document):
        assert "422" not in operation["responses"], (path, method)
    assert "HTTPValidationError" not in document["components"]["schemas"]
    # A route that declares no errors answers a failed validation with a 400 instead.
    assert "400" in document["paths"]["/v1/agents/{agent_id}"]["get"]["responses"]


def test_the_document_is_well_formed_and_every_reference_resolves(
    document: dict[str, Any],
) -> None:
    assert document["openapi"].startswith("3.1")
    assert document["info"]["title"] == "semantic" and document["info"]["version"]
    operation_ids = []
    for path, method, operation in operations(document):
        assert path.startswith("/") and method in METHODS
        operation_ids.append(operation["operationId"])
        for name in re.findall(r"{(\w+)}", path):
            params = operation.get("parameters", [])
            assert {"name": name, "in": "path"}.items() <= next(
                p for p in params if p["name"] == name
            ).items()
        assert operation["responses"], (path, method)
        for status, response in operation["responses"].items():
            assert re.fullmatch(r"[1-5](\d\d|XX)|default", status), (path, status)
            assert isinstance(response["description"], str) and response["description"]
            for media in response.get("content", {}).values():
                assert "schema" in media
    assert len(operation_ids) == len(set(operation_ids))
    for reference in set(references(document)):
        assert isinstance(resolve(document, reference), dict), reference
    for name, schema in document["components"]["schemas"].items():
        assert re.fullmatch(r"[\w.-]+", name) and isinstance(schema, dict), name
        assert not any(key.startswith("x-semantic") for key in schema)
    assert "x-semantic-schemas" not in str(document)


def test_with_api_keys_every_route_but_health_documents_the_401(
    served: ServedModel, tmp_path: Path
) -> None:
    with chat_app(served, tmp_path, api_key=["secret"]) as client:
        document = client.get("/openapi.json", headers={"x-api-key": "secret"}).json()
    schemes = document["components"]["securitySchemes"]
    assert schemes["apiKey"] == {"type": "apiKey", "in": "header", "name": "x-api-key"}
    for path, method, operation in operations(document):
        if path.startswith("/health/"):
            assert "401" not in operation["responses"]
        else:
            assert "401" in operation["responses"] and operation["security"], (path, method)


def test_with_admin_keys_the_admin_routes_document_the_403(
    served: ServedModel, tmp_path: Path
) -> None:
    with chat_app(served, tmp_path, admin_api_key=["boss"]) as client:
        document = client.get("/openapi.json", headers={"x-api-key": "boss"}).json()
    # Outside the admin paths (/admin/, /metrics), a 403 is only the agent limit's
    # (max_agents_per_key), where agents are made, and the pin limit's (max_pinned_share).
    limited = {
        ("/v1/agents", "post"),
        ("/v1/agents/{agent_id}/fork", "post"),
        ("/v1/agents/{agent_id}", "patch"),
    }
    for path, method, operation in operations(document):
        expected = path.startswith(("/admin/", "/metrics")) or (path, method) in limited
        assert ("403" in operation["responses"]) == expected, (path, method)
