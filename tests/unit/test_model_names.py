"""Which model names a request may use: any (the loaded model answers) unless
`strict_model_names` is set; then only the served model's names, and any other gets a 404
in the shape of the protocol asked."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from semantic.api.app import create_app
from semantic.errors import ModelNotFound
from semantic.models.registry import ModelRegistry
from semantic.models.served import ServedModel
from semantic.text.chat import CHATML_TEMPLATE, ChatTemplate
from tests.unit.fakes import make_engine

ALIASES = ("smollm2-135m", "smollm2-135m-instruct")
ANTHROPIC = {"anthropic-version": "2023-06-01"}


def chat(model: str) -> dict[str, Any]:
    return {"model": model, "max_tokens": 2, "messages": [{"role": "user", "content": "Hi"}]}


def legacy(model: str) -> dict[str, Any]:
    return {"model": model, "max_tokens": 2, "prompt": "Hi"}


def messages(model: str) -> dict[str, Any]:
    return chat(model)  # Anthropic's body has the same three fields


@pytest.fixture
def named(served: ServedModel) -> ServedModel:
    """Served as `house-model`, and also known by the registry's names; with a chat template
    (the unit fixture's renders nothing)."""
    template = ChatTemplate(CHATML_TEMPLATE, bos_token=None, eos_token="<|im_end|>")
    return dataclasses.replace(served, name="house-model", aliases=ALIASES, chat_template=template)


def app_for(named: ServedModel, tmp_path: Path, strict: bool) -> TestClient:
    engine, _ = make_engine(named, tmp_path, strict_model_names=strict)
    return TestClient(create_app(engine, engine.settings))


@pytest.fixture
def strict(named: ServedModel, tmp_path: Path) -> Iterator[TestClient]:
    with app_for(named, tmp_path, strict=True) as client:
        yield client


def test_any_name_is_served_unless_matching_is_strict(named: ServedModel) -> None:
    named.check_requested_name("claude-sonnet-4-5", strict=False)
    for name in ("house-model", "HOUSE-MODEL", "smollm2-135m-instruct", "SmolLM2-135M"):
        named.check_requested_name(name, strict=True)
    with pytest.raises(ModelNotFound) as raised:
        named.check_requested_name("gpt-4o", strict=True)
    assert str(raised.value) == (
        "The model 'gpt-4o' does not exist on this server; "
        "available: house-model, smollm2-135m, smollm2-135m-instruct"
    )


def test_the_registry_gives_a_builtin_model_its_other_names(smollm2_path: Path) -> None:
    source = ModelRegistry().resolve("SmolLM2-135M-Instruct")
    assert (source.name, source.aliases) == ("smollm2-135m", ("smollm2-135m-instruct",))


def test_by_default_every_api_serves_any_model_name_and_echoes_it(
    named: ServedModel, tmp_path: Path
) -> None:
    with app_for(named, tmp_path, strict=False) as client:
        assert client.post("/v1/chat/completions", json=chat("gpt-4o")).json()["model"] == "gpt-4o"
        assert client.post("/v1/completions", json=legacy("davinci")).json()["model"] == "davinci"
        answer = client.post("/v1/messages", json=messages("claude-x")).json()
        assert answer["model"] == "claude-x"
        assert client.get("/v1/models/gpt-4o").json()["id"] == "gpt-4o"


@pytest.mark.parametrize(
    ("path", "body"),
    [("/v1/chat/completions", chat), ("/v1/completions", legacy)],
    ids=["chat", "completions"],
)
def test_strict_openai_routes_refuse_an_unknown_model_with_model_not_found(
    strict: TestClient, path: str, body: Any
) -> None:
    response = strict.post(path, json=body("gpt-4o"))
    assert response.status_code == 404
    error = response.json()["error"]
    assert (error["type"], error["code"], error["param"]) == (
        "invalid_request_error",
        "model_not_found",
        None,
    )
    assert "'gpt-4o' does not exist" in error["message"] and "house-model" in error["message"]
    for name in ("house-model", "SmolLM2-135M-Instruct"):
        assert strict.post(path, json=body(name)).status_code == 200


@pytest.mark.parametrize("path", ["/v1/messages", "/v1/messages/count_tokens"])
def test_strict_anthropic_routes_refuse_an_unknown_model_with_not_found_error(
    strict: TestClient, path: str
) -> None:
    response = strict.post(f"{path}?beta=true", json=messages("claude-sonnet-4-5"))
    assert response.status_code == 404
    body = response.json()
    assert body["type"] == "error" and body["error"]["type"] == "not_found_error"
    assert "available: house-model" in body["error"]["message"]
    assert strict.post(path, json=messages("smollm2-135m")).status_code == 200


def test_strict_model_lookup_is_a_404_in_the_shape_the_client_speaks(strict: TestClient) -> None:
    assert strict.get("/v1/models/house-model").json()["id"] == "house-model"
    openai_404 = strict.get("/v1/models/gpt-4o")
    assert openai_404.status_code == 404
    assert openai_404.json()["error"]["code"] == "model_not_found"
    anthropic_404 = strict.get("/v1/models/claude-x", headers=ANTHROPIC)
    assert anthropic_404.status_code == 404
    assert anthropic_404.json()["error"]["type"] == "not_found_error"
