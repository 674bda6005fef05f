"""What a newcomer's first requests get: an index at `/`, a 405 whose `Allow` lists every method
of the path, a 404 that names the path and where the routes are, and a context overflow that
names the field the client can change."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from semantic import __version__
from semantic.models.served import ServedModel
from tests.unit.fakes import chat_app

CHAT = "/v1/chat/completions"


@pytest.fixture
def api(chat_served: ServedModel, tmp_path: Path) -> Iterator[TestClient]:
    with chat_app(chat_served, tmp_path) as client:
        yield client


def chat(**fields: object) -> dict[str, object]:
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}


def test_the_root_answers_a_small_index(api: TestClient, chat_served: ServedModel) -> None:
    response = api.get("/")
    assert response.status_code == 200
    assert response.json() == {
        "name": "semantic",
        "version": __version__,
        "model": chat_served.name,
        "links": {"docs": "/docs", "openapi": "/openapi.json", "health": "/health/ready"},
    }
    assert api.get("/docs").status_code == 200  # where it points
    assert api.head("/").status_code == 200  # Claude Code's probe still answers


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_the_api_pages_load_nothing_from_another_machine(api: TestClient, page: str) -> None:
    """/docs and /redoc work offline: every script, style and icon they name is the server's
    own, and it serves each of them."""
    html = api.get(page).text
    named = re.findall(r"""(?:src|href)\s*=\s*["']([^"']*)["']|url\(["']?([^"')]*)""", html)
    urls = [src or css for src, css in named]
    assert len(urls) >= 2  # a script, and a style or an icon
    for url in urls:
        assert not re.match(r"(?i)^([a-z][a-z0-9+.-]*:)?//", url), url  # no other host
        if url.startswith("/"):
            assert api.get(url).status_code == 200, url
    assert "http://" not in html
    assert "https://" not in html


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [
        ("GET", CHAT, "POST"),
        ("PUT", "/v1/agents", "GET, POST"),
        ("POST", "/v1/agents/a", "GET, PATCH, DELETE"),
        ("DELETE", "/", "GET, HEAD"),
    ],
)
def test_a_405_lists_every_method_of_the_path(
    api: TestClient, method: str, path: str, allow: str
) -> None:
    response = api.request(method, path)
    assert response.status_code == 405
    assert response.headers["allow"] == allow
    assert response.json()["error"]["message"] == f"{path} takes {allow}, not {method}"
    assert response.json()["error"]["code"] == "method_not_allowed"


def test_a_405_on_an_anthropic_route_is_in_anthropics_shape(api: TestClient) -> None:
    response = api.get("/v1/messages")
    assert (response.status_code, response.headers["allow"]) == (405, "POST")
    assert response.json()["type"] == "error"


def test_a_404_names_the_path_and_where_the_routes_are(api: TestClient) -> None:
    response = api.post("/v1/chat/completion", json=chat())
    assert response.status_code == 404
    assert response.json()["error"] == {
        "message": "no route POST /v1/chat/completion: the routes are listed at /docs and "
        "/openapi.json",
        "type": "not_found_error",
        "param": None,
        "code": "unknown_route",
    }


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
def test_an_overflow_of_the_asked_output_names_that_field(api: TestClient, field: str) -> None:
    response = api.post(CHAT, json=chat(**{field: 10**6}))
    assert response.status_code == 400
    error = response.json()["error"]
    assert (error["code"], error["param"]) == ("context_length_exceeded", field)


def test_a_prompt_that_leaves_no_room_still_names_the_messages(api: TestClient) -> None:
    long = [{"role": "user", "content": "hello world " * 400}]
    response = api.post(CHAT, json={"model": "m", "messages": long, "max_tokens": 1})
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "messages"
