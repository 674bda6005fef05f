"""Malformed OpenAI requests: each gets the right 4xx in OpenAI's error shape, never a 500,
on /v1/chat/completions and /v1/completions. One app over the fake runner
answers the whole table."""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from semantic.api import openai as openai_api
from semantic.api.app import create_app
from semantic.engine.engine import Engine
from semantic.errors import Overloaded
from semantic.text.chat import CHATML_TEMPLATE, ChatTemplate
from semantic.text.tokenizer import Tokenizer
from tests.unit.fakes import fake_served, make_engine

CHAT = "/v1/chat/completions"
LEGACY = "/v1/completions"
GOOD: dict[str, Any] = {
    "model": "gpt-4o",
    "max_tokens": 4,
    "messages": [{"role": "user", "content": "Hello"}],
}
GOOD_LEGACY: dict[str, Any] = {"model": "gpt-3.5-turbo-instruct", "max_tokens": 4, "prompt": "Hi"}
FUNCTION = {"type": "function", "function": {"name": "ls", "parameters": {"type": "object"}}}


def with_(**fields: Any) -> dict[str, Any]:
    return GOOD | fields


def without(field: str, body: dict[str, Any] = GOOD) -> dict[str, Any]:
    return {k: v for k, v in body.items() if k != field}


def message(**fields: Any) -> dict[str, Any]:
    return with_(messages=[{"role": "user", "content": "Hello"} | fields])


def parts(*content: Any) -> dict[str, Any]:
    return with_(messages=[{"role": "user", "content": list(content)}])


def calls(*tool_calls: Any, **fields: Any) -> dict[str, Any]:
    """A history whose assistant turn made `tool_calls`, answered by a tool message."""
    assistant = {"role": "assistant", "content": None, "tool_calls": list(tool_calls)}
    tool = {"role": "tool", "tool_call_id": "call_1", "content": "done"} | fields
    return with_(messages=[*GOOD["messages"], assistant, tool])


def call(**function: Any) -> dict[str, Any]:
    return {"id": "call_1", "type": "function", "function": {"name": "ls"} | function}


def legacy(**fields: Any) -> dict[str, Any]:
    return GOOD_LEGACY | fields


Body = dict[str, Any] | bytes
FORM = {"content-type": "application/x-www-form-urlencoded"}
MULTIPART = {"content-type": "multipart/form-data; boundary=b"}

# (what is wrong, route, body, extra headers, expected status, the `param` the error names)
MALFORMED: list[tuple[str, str, Body, dict[str, str], int, str | None]] = [
    # the body itself
    ("body is not JSON", CHAT, b"{not json", {}, 400, None),
    ("body is empty", CHAT, b"", {}, 400, None),
    ("body is a JSON array", CHAT, b"[]", {}, 400, None),
    ("body is a JSON string", CHAT, b'"hello"', {}, 400, None),
    ("body is not UTF-8", CHAT, b'{"model": "\xff\xfe"}', {}, 400, None),
    ("body nests 100k deep", CHAT, b"[" * 100_000, {}, 400, None),
    ("body is form-encoded", CHAT, b"model=m&messages=hi", FORM, 400, None),
    ("body is multipart", LEGACY, b"--b\r\n\r\nhi\r\n--b--\r\n", MULTIPART, 400, None),
    (
        "NaN temperature",
        CHAT,
        json.dumps(with_(temperature=float("nan"))).encode(),
        {},
        400,
        "temperature",
    ),
    ("Infinity top_p", LEGACY, json.dumps(legacy(top_p=float("inf"))).encode(), {}, 400, "top_p"),
    # model
    ("model missing", CHAT, without("model"), {}, 400, "model"),
    ("model is a number", CHAT, with_(model=4), {}, 400, "model"),
    ("model is empty", CHAT, with_(model=""), {}, 400, "model"),
    ("legacy model is null", LEGACY, legacy(model=None), {}, 400, "model"),
    # messages and their roles, content and parts
    ("messages missing", CHAT, without("messages"), {}, 400, "messages"),
    ("messages is a string", CHAT, with_(messages="Hello"), {}, 400, "messages"),
    ("messages is empty", CHAT, with_(messages=[]), {}, 400, "messages"),
    ("a message is a string", CHAT, with_(messages=["Hello"]), {}, 400, "messages.0"),
    (
        "a message has no role",
        CHAT,
        with_(messages=[{"content": "Hi"}]),
        {},
        400,
        "messages.0.role",
    ),
    ("a role is unknown", CHAT, message(role="wizard"), {}, 400, "messages.0.role"),
    ("a role is a number", CHAT, message(role=1), {}, 400, "messages.0.role"),
    ("a role is capitalised", CHAT, message(role="User"), {}, 400, "messages.0.role"),
    ("content is a number", CHAT, message(content=5), {}, 400, "messages.0.content"),
    ("content is an object", CHAT, message(content={"text": "Hi"}), {}, 400, "messages.0.content"),
    ("a part is a string", CHAT, parts("Hello"), {}, 400, "messages.0.content.0"),
    ("a part has no type", CHAT, parts({"text": "Hello"}), {}, 400, "messages.0.content.0.type"),
    (
        "a text part's text is a number",
        CHAT,
        parts({"type": "text", "text": 1}),
        {},
        400,
        "messages.0.content.0.text",
    ),
    ("a name is a number", CHAT, message(name=7), {}, 400, "messages.0.name"),
    # tool calls in the history, and their ids
    (
        "tool_calls is an object",
        CHAT,
        with_(messages=[{"role": "assistant", "tool_calls": {}}]),
        {},
        400,
        "messages.0.tool_calls",
    ),
    (
        "a tool call has no function",
        CHAT,
        calls({"id": "call_1", "type": "function"}),
        {},
        400,
        "messages.1.tool_calls.0.function",
    ),
    (
        "a tool call's arguments are an object",
        CHAT,
        calls(call(arguments={"a": 1})),
        {},
        400,
        "messages.1.tool_calls.0.function.arguments",
    ),
    (
        "a tool call's arguments are not JSON",
        CHAT,
        calls(call(arguments="{oops")),
        {},
        400,
        "messages",
    ),
    (
        "a tool call's id is a number",
        CHAT,
        calls(call(arguments="{}") | {"id": 12}),
        {},
        400,
        "messages.1.tool_calls.0.id",
    ),
    (
        "a tool_call_id is a number",
        CHAT,
        calls(call(arguments="{}"), tool_call_id=12),
        {},
        400,
        "messages.2.tool_call_id",
    ),
    # tool definitions and tool_choice
    ("tools is an object", CHAT, with_(tools=FUNCTION), {}, 400, "tools"),
    ("a tool is a string", CHAT, with_(tools=["ls"]), {}, 400, "tools.0"),
    (
        "a tool's type is not function",
        CHAT,
        with_(tools=[FUNCTION | {"type": "retrieval"}]),
        {},
        400,
        "tools.0.type",
    ),
    (
        "a tool has no function",
        CHAT,
        with_(tools=[{"type": "function"}]),
        {},
        400,
        "tools.0.function",
    ),
    (
        "a function has no name",
        CHAT,
        with_(tools=[{"type": "function", "function": {}}]),
        {},
        400,
        "tools.0.function.name",
    ),
    (
        "a function's parameters are a string",
        CHAT,
        with_(tools=[{"type": "function", "function": {"name": "ls", "parameters": "{}"}}]),
        {},
        400,
        "tools.0.function.parameters",
    ),
    ("two functions share a name", CHAT, with_(tools=[FUNCTION, FUNCTION]), {}, 400, "tools"),
    (
        "tool_choice is unknown",
        CHAT,
        with_(tools=[FUNCTION], tool_choice="always"),
        {},
        400,
        "tool_choice",
    ),
    (
        "tool_choice names no tool",
        CHAT,
        with_(tools=[FUNCTION], tool_choice={"type": "function", "function": {"name": "rm"}}),
        {},
        400,
        "tool_choice",
    ),
    (
        "tool_choice required without tools",
        CHAT,
        with_(tool_choice="required"),
        {},
        400,
        "tool_choice",
    ),
    # sizes, sampling and huge values
    ("max_tokens is negative", CHAT, with_(max_tokens=-1), {}, 400, "max_tokens"),
    ("max_tokens is 0", CHAT, with_(max_tokens=0), {}, 400, "max_tokens"),
    ("max_tokens is a string", CHAT, with_(max_tokens="10"), {}, 400, "max_tokens"),
    ("max_tokens is a float", CHAT, with_(max_tokens=1.5), {}, 400, "max_tokens"),
    ("max_tokens is a bool", CHAT, with_(max_tokens=True), {}, 400, "max_tokens"),
    ("max_tokens is a billion", CHAT, with_(max_tokens=10**9), {}, 400, "max_tokens"),
    ("max_tokens is 2**80", LEGACY, legacy(max_tokens=2**80), {}, 400, "max_tokens"),
    (
        "max_completion_tokens is 0",
        CHAT,
        with_(max_completion_tokens=0),
        {},
        400,
        "max_completion_tokens",
    ),
    ("temperature above 2", CHAT, with_(temperature=3), {}, 400, "temperature"),
    ("temperature is a string", CHAT, with_(temperature="hot"), {}, 400, "temperature"),
    ("top_p is 0", CHAT, with_(top_p=0), {}, 400, "top_p"),
    ("top_p above 1", LEGACY, legacy(top_p=1.5), {}, 400, "top_p"),
    ("top_k below -1", CHAT, with_(top_k=-2), {}, 400, "top_k"),
    ("seed is a string", CHAT, with_(seed="42"), {}, 400, "seed"),
    ("stop is a number", CHAT, with_(stop=5), {}, 400, "stop"),
    ("a stop is a number", CHAT, with_(stop=["a", 5]), {}, 400, "stop.1"),
    ("a stop is empty", CHAT, with_(stop=[""]), {}, 400, "stop"),
    ("too many stops", LEGACY, legacy(stop=["s"] * 17), {}, 400, "stop"),
    ("n is 2", CHAT, with_(n=2), {}, 400, "n"),
    ("n is 0", CHAT, with_(n=0), {}, 400, "n"),
    ("min_tokens is negative", CHAT, with_(min_tokens=-1), {}, 400, "min_tokens"),
    ("ignore_eos is a string", CHAT, with_(ignore_eos="yes"), {}, 400, "ignore_eos"),
    (
        "the prompt is longer than the context",
        CHAT,
        message(content="Hello world! " * 300),
        {},
        400,
        "messages",
    ),
    # streaming
    ("stream is a string", CHAT, with_(stream="yes"), {}, 400, "stream"),
    ("stream_options is a string", CHAT, with_(stream_options="usage"), {}, 400, "stream_options"),
    (
        "include_usage is a string",
        LEGACY,
        legacy(stream_options={"include_usage": "yes"}),
        {},
        400,
        "stream_options.include_usage",
    ),
    # agent ids
    ("session_id is a path", CHAT, with_(session_id="../../etc/passwd"), {}, 400, "session_id"),
    ("session_id is too long", LEGACY, legacy(session_id="a" * 200), {}, 400, "session_id"),
    ("session_id is a number", CHAT, with_(session_id=7), {}, 400, "session_id"),
    ("x-session-id is a path", CHAT, GOOD, {"x-session-id": "../x"}, 400, "x-session-id"),
    # legacy prompts and the fields this server refuses
    ("prompt missing", LEGACY, without("prompt", GOOD_LEGACY), {}, 400, "prompt"),
    ("prompt is a number", LEGACY, legacy(prompt=5), {}, 400, "prompt"),
    ("prompt is an object", LEGACY, legacy(prompt={"text": "Hi"}), {}, 400, "prompt"),
    ("prompt is two strings", LEGACY, legacy(prompt=["Hi", "Ho"]), {}, 400, "prompt"),
    ("prompt mixes text and ids", LEGACY, legacy(prompt=["Hi", 5]), {}, 400, "prompt.0"),
    ("prompt is two token lists", LEGACY, legacy(prompt=[[5], [6]]), {}, 400, "prompt"),
    ("a prompt token id is negative", LEGACY, legacy(prompt=[5, -1]), {}, 400, "prompt"),
    (
        "a prompt token id is past the vocabulary",
        LEGACY,
        legacy(prompt=[5, 10**6]),
        {},
        400,
        "prompt",
    ),
    ("a prompt token id is a bool", LEGACY, legacy(prompt=[True]), {}, 400, "prompt.0"),
    ("prompt is empty", LEGACY, legacy(prompt=""), {}, 400, None),
    ("prompt is an empty list", LEGACY, legacy(prompt=[]), {}, 400, None),
    ("legacy n is 3", LEGACY, legacy(n=3), {}, 400, "n"),
    ("best_of is 2", LEGACY, legacy(best_of=2), {}, 400, "best_of"),
    ("logprobs is 5", LEGACY, legacy(logprobs=5), {}, 400, "logprobs"),
    ("logprobs is 0", LEGACY, legacy(logprobs=0), {}, 400, "logprobs"),
    ("suffix is set", LEGACY, legacy(suffix="}"), {}, 400, "suffix"),
    ("echo is a string", LEGACY, legacy(echo="yes"), {}, 400, "echo"),
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


def assert_openai_error(
    response: Any, status: int, type_: str = "invalid_request_error"
) -> dict[str, Any]:
    """The response is OpenAI's error JSON with this status and type; returns the error."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert set(body) == {"error"}
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["type"] == type_
    assert isinstance(error["message"], str) and error["message"]
    assert error["param"] is None or isinstance(error["param"], str)
    assert error["code"] is None or isinstance(error["code"], str)
    return dict(error)


def test_the_table_is_large_and_every_good_request_in_it_would_pass(api: TestClient) -> None:
    assert len(MALFORMED) >= 40
    assert api.post(CHAT, json=GOOD).status_code == 200
    assert api.post(CHAT, json=calls(call(arguments="{}"))).status_code == 200
    assert api.post(LEGACY, json=GOOD_LEGACY).status_code == 200


@pytest.mark.parametrize(
    ("path", "body", "headers", "status", "param"),
    [pytest.param(*row[1:], id=row[0]) for row in MALFORMED],
)
@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_a_malformed_request_gets_a_4xx_in_openais_shape(
    api: TestClient,
    path: str,
    body: Body,
    headers: dict[str, str],
    status: int,
    param: str | None,
    stream: bool,
) -> None:
    if stream and isinstance(body, dict) and "stream" not in body:
        body = body | {"stream": True}
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    error = assert_openai_error(api.post(path, content=raw, headers=headers), status)
    assert error["param"] == param


def test_a_validation_error_names_the_field_that_is_wrong(api: TestClient) -> None:
    said = assert_openai_error(api.post(CHAT, json=message(role="wizard")), 400)["message"]
    assert said.startswith("messages.0.role: Input should be 'system'")
    said = assert_openai_error(api.post(LEGACY, json=legacy(prompt=5)), 400)["message"]
    assert said == "prompt: Input should be a valid string or a valid list"
    said = assert_openai_error(api.post(CHAT, content=b""), 400)["message"]
    assert said == "the request body is empty"


def test_context_overflow_has_its_code_and_the_fields_that_do_not_fit(api: TestClient) -> None:
    error = assert_openai_error(api.post(CHAT, json=with_(max_tokens=10**9)), 400)
    assert error["code"] == "context_length_exceeded"
    assert "maximum context length" in error["message"]
    error = assert_openai_error(api.post(LEGACY, json=legacy(prompt=[5] * 600)), 400)
    assert (error["code"], error["param"]) == ("context_length_exceeded", "prompt")


@pytest.mark.parametrize("path", [CHAT, LEGACY])
def test_a_json_body_is_read_whatever_content_type_it_is_sent_with(
    api: TestClient, path: str
) -> None:
    body = json.dumps(GOOD if path == CHAT else GOOD_LEGACY).encode()
    for content_type in ("text/plain", "application/x-www-form-urlencoded", None):
        headers = {"content-type": content_type} if content_type else {}
        assert api.post(path, content=body, headers=headers).status_code == 200


@pytest.mark.parametrize("path", [CHAT, LEGACY])
def test_a_body_over_the_size_limit_gets_a_413(
    api: TestClient, monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    monkeypatch.setattr(api.app.state.settings, "max_body_mb", 1)  # type: ignore[attr-defined]
    over = "x" * 2**20
    big = message(content=over) if path == CHAT else legacy(prompt=over)
    raw = json.dumps(big).encode()
    error = assert_openai_error(api.post(path, content=raw), 413)
    assert error["message"] == f"request body is {len(raw)} bytes; the limit is {2**20}"
    # Sent in chunks with no content-length, it is counted as it arrives.
    chunked = (raw[i : i + 2**16] for i in range(0, len(raw), 2**16))
    assert_openai_error(api.post(path, content=chunked), 413)
    # Under the limit, the same route answers.
    assert api.post(path, json=GOOD if path == CHAT else GOOD_LEGACY).status_code == 200


def test_unknown_routes_and_methods_answer_in_openais_shape(api: TestClient) -> None:
    assert_openai_error(api.post("/v1/nothing", json=GOOD), 404, "not_found_error")
    assert_openai_error(api.get(LEGACY), 405)
    assert_openai_error(api.get(CHAT), 405)


@pytest.mark.parametrize("path", [CHAT, LEGACY])
def test_an_overloaded_engine_answers_503_and_a_bug_answers_500(
    api: TestClient, monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    engine: Engine = api.app.state.host.engine  # type: ignore[attr-defined]
    good = GOOD if path == CHAT else GOOD_LEGACY

    def overloaded(request: object) -> None:
        raise Overloaded("no room in the KV pool; try again later")

    monkeypatch.setattr(engine, "check", overloaded)
    error = assert_openai_error(api.post(path, json=good), 503, "server_error")
    assert error["code"] == "overloaded"

    def bug(request: object) -> None:
        raise RuntimeError("a bug, not the client's fault")

    monkeypatch.setattr(engine, "check", bug)
    error = assert_openai_error(api.post(path, json=good), 500, "server_error")
    assert "bug" not in error["message"]  # internals stay in the log


@pytest.mark.parametrize("path", [CHAT, LEGACY])
def test_a_fault_after_the_200_is_an_error_chunk_that_keeps_its_internals_to_the_log(
    api: TestClient, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, path: str
) -> None:
    """An exception that is no error of ours (a bug: its text may name paths, keys, internals)
    reaches the client as a generic message; the log has it whole."""

    def bug(usage: object) -> None:
        raise RuntimeError("secret detail in /srv/semantic/internals.py")

    monkeypatch.setattr(openai_api, "usage_json", bug)
    good = GOOD if path == CHAT else GOOD_LEGACY
    body = {**good, "stream": True, "stream_options": {"include_usage": True}}
    with caplog.at_level(logging.ERROR):
        streamed = api.post(path, json=body)
    assert streamed.status_code == 200
    chunks = [line.removeprefix("data: ") for line in streamed.text.splitlines() if line]
    error = json.loads(chunks[-1])["error"]
    assert error == {
        "message": "internal server error",
        "type": "server_error",
        "param": None,
        "code": None,
    }
    assert "secret detail" not in streamed.text and "secret detail" in caplog.text


def test_every_status_in_the_table_is_documented_for_its_route(api: TestClient) -> None:
    paths = api.get("/openapi.json").json()["paths"]
    for what, path, _, _, status, _ in MALFORMED:
        assert str(status) in paths[path]["post"]["responses"], what
    for path in (CHAT, LEGACY):
        assert {"413", "500", "503"} <= set(paths[path]["post"]["responses"])
