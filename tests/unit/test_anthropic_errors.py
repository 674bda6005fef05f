"""Malformed Anthropic requests: each gets the right 4xx in Anthropic's error shape, never a
500. One app over the fake runner answers the whole table."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from semantic.api.app import create_app
from semantic.api.errors import anthropic_error_event, anthropic_message, anthropic_status
from semantic.engine.engine import Engine
from semantic.errors import ContextOverflow, EngineFailure, Overloaded
from semantic.text.chat import CHATML_TEMPLATE, ChatTemplate
from semantic.text.tokenizer import Tokenizer
from tests.unit.fakes import fake_served, make_engine

GOOD: dict[str, Any] = {
    "model": "claude-sonnet-4-5",
    "max_tokens": 4,
    "messages": [{"role": "user", "content": "Hello"}],
}
BAD_REQUEST = (400, "invalid_request_error")


def with_(**fields: Any) -> dict[str, Any]:
    return GOOD | fields


def without(field: str) -> dict[str, Any]:
    return {k: v for k, v in GOOD.items() if k != field}


def message(**fields: Any) -> dict[str, Any]:
    return with_(messages=[{"role": "user", "content": "Hello"} | fields])


def blocks(*content: Any) -> dict[str, Any]:
    return with_(messages=[{"role": "user", "content": list(content)}])


Body = dict[str, Any] | bytes

# (what is wrong, body, extra headers, expected status and error type)
MALFORMED: list[tuple[str, Body, dict[str, str], tuple[int, str]]] = [
    ("body is not JSON", b"{not json", {}, BAD_REQUEST),
    ("body is empty", b"", {}, BAD_REQUEST),
    ("body is a JSON array", b"[]", {}, BAD_REQUEST),
    ("body is a JSON string", b'"hello"', {}, BAD_REQUEST),
    ("body is not UTF-8", b'{"model": "\xff\xfe"}', {}, BAD_REQUEST),
    ("body nests 100k deep", b"[" * 100_000, {}, BAD_REQUEST),
    ("NaN temperature", json.dumps(with_(temperature=float("nan"))).encode(), {}, BAD_REQUEST),
    ("model missing", without("model"), {}, BAD_REQUEST),
    ("model is a number", with_(model=4), {}, BAD_REQUEST),
    ("model is empty", with_(model=""), {}, BAD_REQUEST),
    ("messages missing", without("messages"), {}, BAD_REQUEST),
    ("messages is a string", with_(messages="Hello"), {}, BAD_REQUEST),
    ("messages is empty", with_(messages=[]), {}, BAD_REQUEST),
    ("a message is a string", with_(messages=["Hello"]), {}, BAD_REQUEST),
    ("a message has no role", with_(messages=[{"content": "Hello"}]), {}, BAD_REQUEST),
    ("a message has no content", with_(messages=[{"role": "user"}]), {}, BAD_REQUEST),
    ("role is a number", message(role=1), {}, BAD_REQUEST),
    ("content is a number", message(content=5), {}, BAD_REQUEST),
    ("content is null", message(content=None), {}, BAD_REQUEST),
    ("content is an object", message(content={"type": "text", "text": "Hi"}), {}, BAD_REQUEST),
    ("a block is a string", blocks("Hello"), {}, BAD_REQUEST),
    ("a block has no type", blocks({"text": "Hello"}), {}, BAD_REQUEST),
    ("a block's type is a number", blocks({"type": 3}), {}, BAD_REQUEST),
    ("a text block has no text", blocks({"type": "text"}), {}, BAD_REQUEST),
    ("a text block's text is a number", blocks({"type": "text", "text": 1}), {}, BAD_REQUEST),
    (
        "a tool_use has no id",
        blocks({"type": "tool_use", "name": "f", "input": {}}),
        {},
        BAD_REQUEST,
    ),
    (
        "a tool_use input is a string",
        blocks({"type": "tool_use", "id": "t", "name": "f", "input": "{}"}),
        {},
        BAD_REQUEST,
    ),
    ("a tool_result has no tool_use_id", blocks({"type": "tool_result"}), {}, BAD_REQUEST),
    (
        "a tool_result's content is a number",
        blocks({"type": "tool_result", "tool_use_id": "t", "content": 7}),
        {},
        BAD_REQUEST,
    ),
    ("max_tokens missing", without("max_tokens"), {}, BAD_REQUEST),
    ("max_tokens is a string", with_(max_tokens="100"), {}, BAD_REQUEST),
    ("max_tokens is negative", with_(max_tokens=-1), {}, BAD_REQUEST),
    ("max_tokens is a float", with_(max_tokens=1.5), {}, BAD_REQUEST),
    ("max_tokens is a bool", with_(max_tokens=True), {}, BAD_REQUEST),
    ("temperature above 1", with_(temperature=1.5), {}, BAD_REQUEST),
    ("temperature is a string", with_(temperature="hot"), {}, BAD_REQUEST),
    ("top_p below 0", with_(top_p=-0.1), {}, BAD_REQUEST),
    ("top_k is negative", with_(top_k=-1), {}, BAD_REQUEST),
    ("stop_sequences is a string", with_(stop_sequences="END"), {}, BAD_REQUEST),
    ("a stop sequence is a number", with_(stop_sequences=[1]), {}, BAD_REQUEST),
    ("a stop sequence is empty", with_(stop_sequences=[""]), {}, BAD_REQUEST),
    ("too many stop sequences", with_(stop_sequences=["s"] * 1000), {}, BAD_REQUEST),
    ("stream is a string", with_(stream="yes"), {}, BAD_REQUEST),
    ("system is a number", with_(system=42), {}, BAD_REQUEST),
    ("a system block is a number", with_(system=[42]), {}, BAD_REQUEST),
    ("metadata is a string", with_(metadata="user-1"), {}, BAD_REQUEST),
    ("metadata.user_id is a number", with_(metadata={"user_id": 7}), {}, BAD_REQUEST),
    ("metadata.user_id is huge", with_(metadata={"user_id": "u" * 10_000}), {}, BAD_REQUEST),
    ("tools is an object", with_(tools={"name": "f"}), {}, BAD_REQUEST),
    ("a tool has no name", with_(tools=[{"input_schema": {}}]), {}, BAD_REQUEST),
    (
        "a tool schema is a string",
        with_(tools=[{"name": "f", "input_schema": "{}"}]),
        {},
        BAD_REQUEST,
    ),
    ("tool_choice is a string", with_(tool_choice="auto"), {}, BAD_REQUEST),
    ("tool_choice has no type", with_(tool_choice={"name": "f"}), {}, BAD_REQUEST),
    ("thinking is a string", with_(thinking="on"), {}, BAD_REQUEST),
    (
        "thinking.budget_tokens is a string",
        with_(thinking={"type": "enabled", "budget_tokens": "lots"}),
        {},
        BAD_REQUEST,
    ),
    (
        "thinking.budget_tokens is a float",
        with_(thinking={"type": "enabled", "budget_tokens": 1024.5}),
        {},
        BAD_REQUEST,
    ),
    (
        "thinking.display is unknown",
        with_(thinking={"type": "adaptive", "display": "loud"}),
        {},
        BAD_REQUEST,
    ),
    (
        "an image block to a text-only model",
        blocks(
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iV"}}
        ),
        {},
        BAD_REQUEST,
    ),
    ("an image block without its data", blocks({"type": "image"}), {}, BAD_REQUEST),
    ("output_config.effort is a number", with_(output_config={"effort": 3}), {}, BAD_REQUEST),
    (
        "output_config.format has no schema",
        with_(output_config={"format": {"type": "json_schema"}}),
        {},
        BAD_REQUEST,
    ),
    (
        "output_config.format type is unknown",
        with_(output_config={"format": {"type": "xml", "schema": {}}}),
        {},
        BAD_REQUEST,
    ),
    (
        "output_config.format schema the engine cannot take",
        with_(output_config={"format": {"type": "json_schema", "schema": {"type": "nope"}}}),
        {},
        BAD_REQUEST,
    ),
    (
        "a tool's strict is a string",
        with_(tools=[{"name": "f", "input_schema": {}, "strict": "yes"}]),
        {},
        BAD_REQUEST,
    ),
    ("x-session-id is a path", GOOD, {"x-session-id": "../../etc/passwd"}, BAD_REQUEST),
    ("x-session-id is too long", GOOD, {"x-session-id": "a" * 200}, BAD_REQUEST),
    (
        "the prompt is longer than the context",
        message(content="Hello world! " * 300),
        {},
        BAD_REQUEST,
    ),
]


@pytest.fixture(scope="module")
def api(
    tiny_tokenizer: Tokenizer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[TestClient]:
    template = ChatTemplate(CHATML_TEMPLATE, bos_token=None, eos_token="<|im_end|>")
    served = dataclasses.replace(fake_served(tiny_tokenizer), chat_template=template)
    engine, _ = make_engine(served, tmp_path_factory.mktemp("cache"))
    with TestClient(create_app(engine, engine.settings), raise_server_exceptions=False) as client:
        yield client


def assert_anthropic_error(response: Any, status: int, type_: str) -> str:
    """The response is Anthropic's error JSON with this status and type; returns the message."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert set(body) == {"type", "error", "request_id"} and body["type"] == "error"
    assert set(body["error"]) == {"type", "message"} and body["error"]["type"] == type_
    assert body["request_id"] == response.headers["request-id"]
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    return str(body["error"]["message"])


def test_the_table_is_large_and_every_good_request_in_it_would_pass(api: TestClient) -> None:
    assert len(MALFORMED) >= 40
    assert api.post("/v1/messages", json=GOOD).status_code == 200


@pytest.mark.parametrize(
    ("body", "headers", "expected"),
    [pytest.param(body, headers, expected, id=what) for what, body, headers, expected in MALFORMED],
)
@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_a_malformed_message_request_gets_a_4xx_in_anthropics_shape(
    api: TestClient, body: Body, headers: dict[str, str], expected: tuple[int, str], stream: bool
) -> None:
    if stream and isinstance(body, dict) and "stream" not in body:
        body = body | {"stream": True}
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    response = api.post("/v1/messages?beta=true", content=raw, headers=headers)
    assert_anthropic_error(response, *expected)


def test_a_validation_error_names_the_field_that_is_wrong(api: TestClient) -> None:
    said = assert_anthropic_error(
        api.post("/v1/messages", json=without("max_tokens")), *BAD_REQUEST
    )
    assert said.startswith("max_tokens:")
    said = assert_anthropic_error(api.post("/v1/messages", json=message(content=5)), *BAD_REQUEST)
    assert said.startswith("messages.0.content:")
    said = assert_anthropic_error(api.post("/v1/messages", json=with_(top_k=-1)), *BAD_REQUEST)
    assert said.startswith("top_k:")


@pytest.mark.parametrize(
    "body",
    [
        {"model": "m"},
        {"messages": [{"role": "user", "content": "hi"}]},
        b"nope",
        b"[1]",
        {"model": "m", "messages": [{"role": "user", "content": [{"type": "image"}]}]},
        {
            "model": "m",
            "messages": [{"role": "user", "content": "hi"}],
            "thinking": {"type": "enabled", "budget_tokens": "x"},
        },
    ],
    ids=["no messages", "no model", "not JSON", "not an object", "an image", "bad budget"],
)
def test_a_malformed_count_tokens_request_gets_a_400(api: TestClient, body: Body) -> None:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    response = api.post("/v1/messages/count_tokens?beta=true", content=raw)
    assert_anthropic_error(response, *BAD_REQUEST)


def test_a_body_over_the_size_limit_gets_a_413(
    api: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(api.app.state.settings, "max_body_mb", 1)  # type: ignore[attr-defined]
    big = message(content="x" * 2**20)
    for path in ("/v1/messages", "/v1/messages/count_tokens"):
        assert_anthropic_error(api.post(path, json=big), 413, "request_too_large")


ANTHROPIC = {"anthropic-version": "2023-06-01"}


def test_unknown_routes_and_methods_answer_in_anthropics_shape(api: TestClient) -> None:
    assert_anthropic_error(
        api.post("/v1/nothing", json=GOOD, headers=ANTHROPIC), 404, "not_found_error"
    )
    assert_anthropic_error(api.get("/v1/messages"), 405, "invalid_request_error")


@pytest.mark.parametrize("limit", ["0", "1001", "ten", "-1"])
def test_a_bad_model_list_limit_gets_a_400(api: TestClient, limit: str) -> None:
    response = api.get(f"/v1/models?limit={limit}", headers=ANTHROPIC)
    assert_anthropic_error(response, *BAD_REQUEST)


def test_an_overloaded_engine_answers_529_and_a_bug_answers_500(
    api: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine: Engine = api.app.state.host.engine  # type: ignore[attr-defined]

    def overloaded(request: object) -> None:
        raise Overloaded("no room in the KV pool; try again later")

    monkeypatch.setattr(engine, "check", overloaded)
    assert_anthropic_error(api.post("/v1/messages", json=GOOD), 529, "overloaded_error")

    def bug(request: object) -> None:
        raise RuntimeError("a bug, not the client's fault")

    monkeypatch.setattr(engine, "check", bug)
    said = assert_anthropic_error(api.post("/v1/messages", json=GOOD), 500, "api_error")
    assert "bug" not in said  # internals stay in the log


def test_errors_map_to_anthropics_statuses_types_and_overflow_wordings() -> None:
    assert anthropic_status(Overloaded("busy")) == 529
    assert anthropic_status(EngineFailure("boom")) == 500
    assert anthropic_error_event(Overloaded("busy")) == {
        "type": "error",
        "error": {"type": "overloaded_error", "message": "busy"},
    }
    assert anthropic_message(ContextOverflow(213456, 0, 200001)) == (
        "prompt is too long: 213456 tokens > 200000 maximum"
    )
    assert anthropic_message(ContextOverflow(184915, 20000, 204648)) == (
        "input length and `max_tokens` exceed context limit: 184915 + 20000 > 204648, "
        "decrease input length or `max_tokens` and try again"
    )
