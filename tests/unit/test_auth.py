"""API keys over the fake runner: 401 in each protocol's shape, both key headers, open health
checks, protected admin routes, keys never logged; and the rule for binding a remote address."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import anthropic
import openai
import pytest
from fastapi.testclient import TestClient

from semantic.cli import main
from semantic.commands.preflight import check_bind
from semantic.errors import SemanticError
from semantic.models.served import ServedModel
from semantic.settings.settings import Settings
from tests.unit.fakes import chat_app

pytestmark = pytest.mark.usefixtures("no_outside_settings")

KEY = "sk-semantic-good-1f2e3d"
FILE_KEY = "sk-semantic-from-file-9a8b"
WRONG = "sk-semantic-wrong-7c6d"
ADMIN = "sk-semantic-admin-5e4f"
MESSAGES = {"model": "tiny", "max_tokens": 3, "messages": [{"role": "user", "content": "Hi"}]}
ROUTES = {"anthropic": "/v1/messages", "openai": "/v1/chat/completions"}


@pytest.fixture
def keyed(served: ServedModel, tmp_path: Path) -> Iterator[TestClient]:
    """The app with two keys: one given directly, one from a key file."""
    key_file = tmp_path / "keys"
    key_file.write_text(f"# one key a line\n\n{FILE_KEY}\n")
    with chat_app(served, tmp_path / "cache", api_key=[KEY], api_key_file=key_file) as client:
        yield client


def header(style: str, key: str) -> dict[str, str]:
    return {"x-api-key": key} if style == "x-api-key" else {"authorization": f"Bearer {key}"}


def test_without_keys_every_route_is_open(served: ServedModel, tmp_path: Path) -> None:
    with chat_app(served, tmp_path) as client:
        assert client.post(ROUTES["anthropic"], json=MESSAGES).status_code == 200
        assert client.post(ROUTES["openai"], json=MESSAGES).status_code == 200
        assert client.get("/admin/cache").status_code == 200


@pytest.mark.parametrize("style", ["x-api-key", "bearer"])
@pytest.mark.parametrize("protocol", ["anthropic", "openai"])
@pytest.mark.parametrize("key", [KEY, FILE_KEY])
def test_either_header_with_any_configured_key_passes(
    keyed: TestClient, style: str, protocol: str, key: str
) -> None:
    response = keyed.post(ROUTES[protocol], json=MESSAGES, headers=header(style, key))
    assert response.status_code == 200, response.text


def test_a_good_bearer_token_passes_beside_a_stale_x_api_key(keyed: TestClient) -> None:
    """Claude Code may send both headers; one matching key is enough."""
    headers = {"x-api-key": WRONG, "authorization": f"Bearer {KEY}"}
    assert keyed.post(ROUTES["anthropic"], json=MESSAGES, headers=headers).status_code == 200


@pytest.mark.parametrize("sent", [{}, {"x-api-key": WRONG}, {"authorization": f"Bearer {WRONG}"}])
def test_anthropic_routes_answer_401_authentication_error(
    keyed: TestClient, sent: dict[str, str]
) -> None:
    response = keyed.post(ROUTES["anthropic"], json=MESSAGES, headers=sent)
    assert response.status_code == 401
    body = response.json()
    assert body["type"] == "error" and body["error"]["type"] == "authentication_error"
    assert body["request_id"] == response.headers["request-id"]
    assert response.headers["www-authenticate"] == "Bearer"
    assert WRONG not in response.text


@pytest.mark.parametrize("sent", [{}, {"x-api-key": WRONG}, {"authorization": f"Bearer {WRONG}"}])
def test_openai_routes_answer_401_invalid_api_key(keyed: TestClient, sent: dict[str, str]) -> None:
    response = keyed.post(ROUTES["openai"], json=MESSAGES, headers=sent)
    assert response.status_code == 401
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["code"] == "invalid_api_key"
    assert error["param"] is None and error["message"]
    assert WRONG not in response.text


def test_a_bearer_scheme_other_than_bearer_is_no_key(keyed: TestClient) -> None:
    headers = {"authorization": f"Basic {KEY}"}
    assert keyed.post(ROUTES["openai"], json=MESSAGES, headers=headers).status_code == 401


def test_the_sdks_raise_their_authentication_errors(keyed: TestClient) -> None:
    claude = anthropic.Anthropic(
        base_url=str(keyed.base_url), api_key=WRONG, http_client=keyed, max_retries=0
    )
    with pytest.raises(anthropic.AuthenticationError):
        claude.messages.create(**MESSAGES)  # type: ignore[call-overload]
    gpt = openai.OpenAI(
        base_url=f"{keyed.base_url}/v1", api_key=WRONG, http_client=keyed, max_retries=0
    )
    with pytest.raises(openai.AuthenticationError) as raised:
        gpt.chat.completions.create(**MESSAGES)  # type: ignore[call-overload]
    assert raised.value.code == "invalid_api_key"
    ok = openai.OpenAI(base_url=f"{keyed.base_url}/v1", api_key=KEY, http_client=keyed)
    assert ok.chat.completions.create(**MESSAGES).choices  # type: ignore[call-overload]


def test_health_checks_need_no_key(keyed: TestClient) -> None:
    assert keyed.get("/health/live").status_code == 200
    assert keyed.get("/health/ready").status_code == 200


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/admin/cache"),
        ("POST", "/admin/cache/persist"),
        ("GET", "/v1/agents"),
        ("GET", "/v1/models"),
        ("GET", "/no/such/route"),
    ],
)
def test_admin_agents_models_and_unknown_routes_need_a_key(
    keyed: TestClient, method: str, path: str
) -> None:
    assert keyed.request(method, path).status_code == 401
    good = keyed.request(method, path, headers={"x-api-key": KEY})
    assert good.status_code == (404 if path == "/no/such/route" else 200)


@pytest.fixture
def with_admin(served: ServedModel, tmp_path: Path) -> Iterator[TestClient]:
    """The app with a plain key and an admin key."""
    with chat_app(served, tmp_path / "cache", api_key=[KEY], admin_api_key=[ADMIN]) as client:
        yield client


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/admin/cache"),
        ("POST", "/admin/cache/persist"),
        ("POST", "/admin/cache/evict"),
        ("GET", "/metrics"),  # its agent and request counts are every key's
    ],
)
def test_with_admin_keys_a_plain_key_gets_403_on_admin_routes(
    with_admin: TestClient, method: str, path: str
) -> None:
    openai_style = with_admin.request(method, path, headers={"authorization": f"Bearer {KEY}"})
    assert openai_style.status_code == 403
    error = openai_style.json()["error"]
    assert error["type"] == "permission_error" and "admin" in error["message"]
    anthropic_sdk = {"x-api-key": KEY, "anthropic-version": "2023-06-01"}
    anthropic_style = with_admin.request(method, path, headers=anthropic_sdk)
    assert anthropic_style.status_code == 403
    body = anthropic_style.json()
    assert body["type"] == "error" and body["error"]["type"] == "permission_error"
    assert body["request_id"] == anthropic_style.headers["request-id"]
    assert with_admin.request(method, path).status_code == 401  # no key is still a 401
    assert with_admin.request(method, path, headers={"x-api-key": ADMIN}).status_code == 200


def test_an_admin_key_reaches_every_route_and_a_plain_one_the_rest(with_admin: TestClient) -> None:
    for key in (KEY, ADMIN):
        for protocol, route in ROUTES.items():
            sent = header("x-api-key" if protocol == "anthropic" else "bearer", key)
            assert with_admin.post(route, json=MESSAGES, headers=sent).status_code == 200
        assert with_admin.get("/v1/agents", headers={"x-api-key": key}).status_code == 200


def test_the_sdks_raise_their_permission_errors(with_admin: TestClient) -> None:
    """The SDKs' generic request helpers reach the admin routes; a 403 is PermissionDeniedError."""
    claude = anthropic.Anthropic(
        base_url=str(with_admin.base_url), api_key=KEY, http_client=with_admin, max_retries=0
    )
    with pytest.raises(anthropic.PermissionDeniedError):
        claude.get("/admin/cache", cast_to=object)
    gpt = openai.OpenAI(
        base_url=str(with_admin.base_url), api_key=KEY, http_client=with_admin, max_retries=0
    )
    with pytest.raises(openai.PermissionDeniedError):
        gpt.post("/admin/cache/persist", cast_to=object)


def test_without_admin_keys_any_key_reaches_the_admin_routes(keyed: TestClient) -> None:
    for key in (KEY, FILE_KEY):
        assert keyed.post("/admin/cache/persist", headers={"x-api-key": key}).status_code == 200


def test_an_admin_key_alone_is_a_key_for_the_bind_rule() -> None:
    check_bind(Settings(host="0.0.0.0", allow_remote=True, admin_api_key=[ADMIN]))


@pytest.mark.parametrize("app", ["keyed", "with_admin"])
def test_keys_never_reach_the_logs(
    app: str, request: pytest.FixtureRequest, caplog: pytest.LogCaptureFixture
) -> None:
    client: TestClient = request.getfixturevalue(app)
    caplog.set_level(logging.DEBUG)
    for route in [*ROUTES.values(), "/admin/cache/persist"]:
        for key in (KEY, FILE_KEY, WRONG, ADMIN):
            for style in ("x-api-key", "bearer"):
                client.post(route, json=MESSAGES, headers=header(style, key))
                streamed = {**MESSAGES, "stream": True}
                client.post(route, json=streamed, headers=header(style, key))
        client.post(route, json=MESSAGES)
    logged = caplog.text + "".join(str(record.__dict__) for record in caplog.records)
    assert "401 on POST /v1/messages" in logged  # the refusals are logged, without the keys
    if app == "with_admin":
        assert "403 on POST /admin/cache/persist" in logged
    for secret in (KEY, FILE_KEY, WRONG, ADMIN):
        assert secret not in logged


@pytest.mark.parametrize("host", ["127.0.0.1", "127.3.2.1", "::1", "localhost"])
def test_loopback_binds_need_neither_allow_remote_nor_a_key(host: str) -> None:
    check_bind(Settings(host=host))


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.20", "example.com"])
def test_a_remote_bind_needs_allow_remote_and_a_key(host: str) -> None:
    with pytest.raises(SemanticError, match="--allow-remote"):
        check_bind(Settings(host=host, api_key=[KEY]))
    with pytest.raises(SemanticError, match="without an API key"):
        check_bind(Settings(host=host, allow_remote=True))
    check_bind(Settings(host=host, allow_remote=True, api_key=[KEY]))


def test_serve_refuses_a_remote_bind_before_loading_anything(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["serve", "--host", "0.0.0.0", "--model", "/no/such/model"]) == 2
    assert "--allow-remote" in capsys.readouterr().err
    assert main(["serve", "--host", "0.0.0.0", "--allow-remote", "--model", "/no/model"]) == 2
    assert "without an API key" in capsys.readouterr().err


def test_wrong_keys_past_auth_failures_per_minute_get_429_and_a_right_key_still_passes(
    served: ServedModel, tmp_path: Path
) -> None:
    """Once an address has sent that many wrong (or no) keys, its next wrong keys get 429; a
    right key from the same address is served (thirty wrong keys from a stale client on
    loopback used to lock out every local client), and another address is not held back."""
    with chat_app(served, tmp_path, api_key=[KEY], auth_failures_per_minute=3) as client:
        for sent in ({"x-api-key": WRONG}, {}, header("bearer", WRONG)):
            assert client.post(ROUTES["openai"], json=MESSAGES, headers=sent).status_code == 401
        for protocol, kind in (("openai", "requests"), ("anthropic", "rate_limit_error")):
            limited = client.post(ROUTES[protocol], json=MESSAGES, headers={"x-api-key": WRONG})
            assert limited.status_code == 429, limited.text
            error = limited.json()["error"]
            assert error["type"] == kind and "wrong API key" in error["message"]
            assert int(limited.headers["retry-after"]) >= 1
            assert client.post(ROUTES[protocol], json=MESSAGES).status_code == 429  # no key
            right = client.post(ROUTES[protocol], json=MESSAGES, headers={"x-api-key": KEY})
            assert right.status_code == 200, right.text
        elsewhere = TestClient(client.app, client=("192.0.2.7", 40000))
        wrong = elsewhere.post(ROUTES["openai"], json=MESSAGES, headers={"x-api-key": WRONG})
        assert wrong.status_code == 401
