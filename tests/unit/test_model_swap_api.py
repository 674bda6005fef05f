"""The swap over HTTP: `POST /admin/models/swap`, `GET /admin/models`, requests waiting at the
gate or refused in their protocol's shape, and swap on request."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from semantic.api.app import create_app
from tests.unit.fake_models import FakeLoader, make_host

COMPLETION = {"model": "gpt-3.5-turbo-instruct", "prompt": "Hello world!", "max_tokens": 4}
MESSAGE = {"model": "claude-x", "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]}
ANTHROPIC = {"anthropic-version": "2023-06-01"}


def client_for(
    loader: FakeLoader, models: dict[str, Path], tmp_path: Path, **settings: Any
) -> Iterator[TestClient]:
    host = make_host(loader, models, tmp_path, **settings)
    with TestClient(create_app(host, host.settings)) as client:
        yield client


@pytest.fixture
def api(loader: FakeLoader, models: dict[str, Path], tmp_path: Path) -> Iterator[TestClient]:
    yield from client_for(loader, models, tmp_path)


def served_model(api: TestClient) -> str:
    model_id: str = api.get("/v1/models").json()["data"][0]["id"]
    return model_id


def test_a_swap_answers_with_its_timings_and_the_apis_serve_the_new_model(
    api: TestClient,
) -> None:
    assert served_model(api) == "a"
    response = api.post("/admin/models/swap", json={"model": "model-b"})
    assert response.status_code == 200
    report = response.json()
    assert (report["previous"], report["model"], report["swapped"]) == ("a", "b", True)
    assert report["seconds"] >= report["load_seconds"] > 0
    assert served_model(api) == "b"
    completion = api.post("/v1/completions", json=COMPLETION)
    assert completion.status_code == 200 and completion.json()["usage"]["completion_tokens"] == 4
    listing = api.get("/admin/models").json()
    assert listing["state"] == "serving" and listing["loaded"]["id"] == "b"
    assert listing["last_swap"]["model"] == "b"
    [alias] = [m for m in listing["registered"] if "model-b" in m["aliases"]]
    assert alias["loaded"] is True
    metrics = api.get("/metrics").text
    assert "semantic_model_swap_duration_seconds_count 1.0" in metrics


def test_a_swap_to_an_unknown_model_is_404_and_to_a_broken_one_400(
    api: TestClient, loader: FakeLoader, models: dict[str, Path]
) -> None:
    missing = api.post("/admin/models/swap", json={"model": "/no/such/model"})
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"
    loader.broken.add("broken")
    failed = api.post("/admin/models/swap", json={"model": str(models["broken"])})
    assert failed.status_code == 400
    error = failed.json()["error"]
    assert error["code"] == "model_load_failed"
    assert "truncated" in error["message"] and "'a' is serving again" in error["message"]
    assert served_model(api) == "a"
    assert api.post("/v1/completions", json=COMPLETION).status_code == 200
    assert api.post("/admin/models/swap", json={}).status_code == 400


def test_requests_during_a_swap_past_swap_wait_s_get_503_or_anthropics_529(
    loader: FakeLoader, models: dict[str, Path], tmp_path: Path
) -> None:
    for api in client_for(loader, models, tmp_path, swap_wait_s=0):
        loader.hold.clear()  # the swap stops in its load
        swap = threading.Thread(
            target=api.post, args=("/admin/models/swap",), kwargs={"json": {"model": "model-b"}}
        )
        swap.start()
        try:
            while loader.loads != ["a", "b"]:
                swap.join(0.01)
            openai = api.post("/v1/completions", json=COMPLETION)
            anthropic = api.post("/v1/messages", json=MESSAGE, headers=ANTHROPIC)
            state = api.get("/admin/models").json()["state"]  # not gated: it answers at once
        finally:
            loader.hold.set()
            swap.join()
        assert openai.status_code == 503
        assert openai.json()["error"]["code"] == "overloaded"
        assert "swapping models" in openai.json()["error"]["message"]
        assert anthropic.status_code == 529
        assert anthropic.json()["error"]["type"] == "overloaded_error"
        assert state == "swapping"
        assert served_model(api) == "b"


def test_with_swap_on_request_a_request_naming_an_alias_is_served_by_that_model(
    loader: FakeLoader, models: dict[str, Path], tmp_path: Path
) -> None:
    for api in client_for(loader, models, tmp_path, swap_on_request=True):
        assert api.post("/v1/completions", json=COMPLETION).status_code == 200
        assert served_model(api) == "a"
        named = api.post("/v1/completions", json={**COMPLETION, "model": "model-b"})
        assert named.status_code == 200 and named.json()["model"] == "model-b"
        assert served_model(api) == "b"
        assert loader.loads == ["a", "b"]
        bad = api.post("/v1/completions", content=b'{"model": "model-b", "prompt": ')
        assert bad.status_code == 400  # the route still reads (and judges) the body


def test_the_swap_route_needs_a_key_when_keys_are_set(
    loader: FakeLoader, models: dict[str, Path], tmp_path: Path
) -> None:
    for api in client_for(loader, models, tmp_path, api_key=["sk-admin"]):
        assert api.post("/admin/models/swap", json={"model": "model-b"}).status_code == 401
        keyed = api.post(
            "/admin/models/swap",
            json={"model": "model-b"},
            headers={"authorization": "Bearer sk-admin"},
        )
        assert keyed.status_code == 200 and loader.loads == ["a", "b"]


def test_with_admin_keys_only_an_admin_key_swaps_by_naming_a_model(
    loader: FakeLoader, models: dict[str, Path], tmp_path: Path
) -> None:
    """A request naming another model's alias would unload the model every other client is
    using: with admin keys set, that is an admin's to do, as the swap route is."""
    keys = {"api_key": ["sk-user"], "admin_api_key": ["sk-admin"]}
    for api in client_for(loader, models, tmp_path, swap_on_request=True, **keys):
        user = {"authorization": "Bearer sk-user"}
        named = api.post("/v1/completions", json={**COMPLETION, "model": "model-b"}, headers=user)
        assert named.status_code == 403, named.text
        error = named.json()["error"]
        assert error["type"] == "permission_error" and "only an admin key" in error["message"]
        refused = api.post("/v1/messages", json={**MESSAGE, "model": "model-b"}, headers=user)
        assert refused.json()["error"]["type"] == "permission_error"
        loaded = api.post("/v1/completions", json={**COMPLETION, "model": "a"}, headers=user)
        assert loaded.status_code == 200 and loader.loads == ["a"]
        admin = {"authorization": "Bearer sk-admin"}
        swapped = api.post(
            "/v1/completions", json={**COMPLETION, "model": "model-b"}, headers=admin
        )
        assert swapped.status_code == 200 and loader.loads == ["a", "b"]


def test_a_swap_to_a_path_that_cannot_be_read_is_a_400_that_says_why(
    api: TestClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    too_long = api.post("/admin/models/swap", json={"model": "m" * 300})
    assert too_long.status_code == 400, too_long.text
    assert "File name too long" in too_long.json()["error"]["message"]
    # A file the server may not read (the tests run as root, whom permissions do not stop).
    unreadable = tmp_path / "secret.gguf"
    unreadable.write_bytes(b"GGUF")
    real_open = Path.open

    def refusing_open(path: Path, *args: Any, **kwargs: Any) -> Any:
        if path == unreadable:
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(Path, "open", refusing_open)
    answer = api.post("/admin/models/swap", json={"model": str(unreadable)})
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["message"].endswith("Permission denied")
    assert served_model(api) == "a"
