"""Web pages cannot use the server (api/browsers.py, api/bodies.py): a page of another origin is
refused, on a loopback connection so is a Host that is not a loopback name (DNS rebinding), and
no page may send a form; each refusal in the protocol's shape, before the key check. Clients
that are not browsers (no Origin: curl, the SDKs) pass, `curl -d` included."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from semantic.api.app import create_app
from semantic.api.browsers import host_name, is_loopback_name
from semantic.models.served import ServedModel
from tests.unit.fakes import make_engine

pytestmark = pytest.mark.usefixtures("no_outside_settings")

# The server as `semantic serve` runs it: the test client's requests arrive on 127.0.0.1:8000.
LOCAL = "http://127.0.0.1:8000"
ATTACKER = "https://attacker.example"
CHAT = (
    "/v1/chat/completions",
    {"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": "Hi"}]},
)
MESSAGES = (
    "/v1/messages",
    {"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": "Hi"}]},
)


@contextmanager
def local_server(
    chat_served: ServedModel, tmp_path: Path, base_url: str = LOCAL, **settings: Any
) -> Iterator[TestClient]:
    engine, _ = make_engine(chat_served, tmp_path, **settings)
    with TestClient(create_app(engine, engine.settings), base_url=base_url) as client:
        yield client


@pytest.fixture
def local(chat_served: ServedModel, tmp_path: Path) -> Iterator[TestClient]:
    with local_server(chat_served, tmp_path) as client:
        yield client


def refused(answer: Any, code: str, status: int = 403) -> str:
    """The refusal's message, once checked to be in the shape of its route's protocol."""
    assert answer.status_code == status, answer.text
    body = answer.json()
    if answer.request.url.path == "/v1/messages":
        assert body["type"] == "error" and body["error"]["type"] == "permission_error"
        return str(body["error"]["message"])
    assert body["error"]["type"] == "permission_error" and body["error"]["code"] == code
    return str(body["error"]["message"])


@pytest.mark.parametrize("route", [CHAT, MESSAGES], ids=["openai", "anthropic"])
def test_a_page_of_another_origin_is_refused_in_the_protocols_shape(
    local: TestClient, route: tuple[str, dict[str, Any]]
) -> None:
    path, body = route
    for origin in (ATTACKER, "http://localhost:3000", "http://127.0.0.1:8001", "null"):
        answer = local.post(path, json=body, headers={"origin": origin})
        assert repr(origin) in refused(answer, "origin_not_allowed")
    # A form, as a page's <form> or fetch sends it without asking the server first.
    form = local.post(
        path, content=b"{}", headers={"origin": ATTACKER, "content-type": "text/plain"}
    )
    refused(form, "origin_not_allowed")
    # Reads too: a page must not list the agents (their system prompts).
    listing = local.get("/v1/agents", headers={"origin": ATTACKER})
    refused(listing, "origin_not_allowed")


def test_the_servers_own_pages_and_clients_without_an_origin_pass(local: TestClient) -> None:
    path, body = CHAT
    assert local.post(path, json=body, headers={"origin": LOCAL}).status_code == 200
    assert local.post(path, json=body).status_code == 200
    # `curl -d`, as the README shows it: a form type, no Origin.
    curl = {"content-type": "application/x-www-form-urlencoded", "user-agent": "curl/8.5.0"}
    assert local.post(path, json=body, headers=curl).status_code == 200


@pytest.mark.parametrize("route", [CHAT, MESSAGES], ids=["openai", "anthropic"])
def test_no_page_may_send_a_form_not_even_the_servers_own(
    local: TestClient, route: tuple[str, dict[str, Any]]
) -> None:
    path, body = route
    for kind in (
        "application/x-www-form-urlencoded",
        "text/plain; charset=utf-8",
        "multipart/form-data; boundary=x",
    ):
        answer = local.post(path, json=body, headers={"origin": LOCAL, "content-type": kind})
        assert answer.status_code == 415, answer.text
        assert "send JSON" in answer.text


@pytest.mark.parametrize("route", [CHAT, MESSAGES], ids=["openai", "anthropic"])
def test_a_rebound_host_name_is_refused_on_a_loopback_connection(
    local: TestClient, route: tuple[str, dict[str, Any]]
) -> None:
    """DNS rebinding: the page's own name, resolving to 127.0.0.1, in Host; same-origin to the
    browser, so its Origin is that name too (or, for a GET, absent)."""
    path, body = route
    for host in (
        "attacker.example:8000",
        "attacker.example",
        "localhost.attacker.example",
        "0.0.0.0:8000",
    ):
        headers = {"host": host, "origin": f"http://{host}"}
        assert repr(host) in refused(
            local.post(path, json=body, headers=headers), "host_not_allowed"
        )
    refused(local.get("/v1/agents", headers={"host": "attacker.example:8000"}), "host_not_allowed")
    for host in ("localhost:8000", "LOCALHOST", "127.0.0.1", "127.0.0.2:8000", "[::1]:8000"):
        assert local.post(path, json=body, headers={"host": host}).status_code == 200, host


def test_allowed_hosts_adds_names_and_a_remote_connection_is_not_checked(
    chat_served: ServedModel, tmp_path: Path
) -> None:
    path, body = CHAT
    proxied = {"host": "llm.internal:443"}
    with local_server(chat_served, tmp_path / "a", allowed_hosts=["LLM.internal"]) as client:
        assert client.post(path, json=body, headers=proxied).status_code == 200
        refused(
            client.post(path, json=body, headers={"host": "other.internal"}), "host_not_allowed"
        )
    # A request that came to another address than loopback (a server bound with
    # --allow-remote, which needs a key): its clients name the server as they please.
    remote = "http://192.0.2.10:8000"
    with local_server(chat_served, tmp_path / "b", base_url=remote) as client:
        assert client.post(path, json=body, headers={"host": "llm.example:8000"}).status_code == 200


def test_allowed_origins_may_use_the_server_and_read_its_answers(
    chat_served: ServedModel, tmp_path: Path
) -> None:
    path, body = CHAT
    app_origin = "https://app.example.com"
    with local_server(chat_served, tmp_path, allowed_origins=[app_origin + "/"]) as client:
        answer = client.post(path, json=body, headers={"origin": app_origin})
        assert answer.status_code == 200
        assert answer.headers["access-control-allow-origin"] == app_origin
        preflight = client.options(
            path,
            headers={
                "origin": app_origin,
                "access-control-request-method": "POST",
                "access-control-request-headers": "content-type, x-api-key",
            },
        )
        assert preflight.status_code == 200
        assert "x-api-key" in preflight.headers["access-control-allow-headers"].lower()
        other = client.options(
            path, headers={"origin": ATTACKER, "access-control-request-method": "POST"}
        )
        refused(other, "origin_not_allowed")
        assert "access-control-allow-origin" not in other.headers


def test_a_refused_page_learns_nothing_of_keys(chat_served: ServedModel, tmp_path: Path) -> None:
    """The refusal comes before the key check: a 403 whether or not the key is right."""
    path, body = CHAT
    with local_server(chat_served, tmp_path, api_key=["sk-right"]) as client:
        for key in ("sk-right", "sk-wrong"):
            answer = client.post(path, json=body, headers={"origin": ATTACKER, "x-api-key": key})
            refused(answer, "origin_not_allowed")
        assert client.post(path, json=body, headers={"x-api-key": "sk-right"}).status_code == 200


def test_host_names_are_read_without_their_port() -> None:
    assert host_name("[::1]:8000") == "[::1]" and host_name("LocalHost:80") == "localhost"
    assert all(map(is_loopback_name, ("localhost", "127.0.0.1", "127.9.9.9", "[::1]", "::1")))
    assert not any(map(is_loopback_name, ("0.0.0.0", "localhost.example", "[::]", "10.0.0.1", "")))
