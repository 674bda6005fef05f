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

from semantic.api import completions as completions_api
from semantic.api import openai as openai_api
from semantic.api.app import create_app
from semantic.engine.engine import Engine
from semantic.errors import Overloaded
from semantic.text.chat import CHATML_TEMPLATE, ChatTemplate
from semantic.text.tokenizer import Tokenizer
from tests.unit.fakes import fake_served, make_engine

CHAT = "/v1/chat/completions"
LEGACY = "/v1/completions"
RESPONSES = "/v1/responses"
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


GOOD_RESPONSE: dict[str, Any] = {"model": "gpt-5-codex", "input": "Hi", "max_output_tokens": 4}


def response(**fields: Any) -> dict[str, Any]:
    return GOOD_RESPONSE | fields


def schema_format(schema: Any) -> dict[str, Any]:
    return with_(response_format={"type": "json_schema", "json_schema": {"schema": schema}})


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
    (
        "an image part to a text-only model",
        CHAT,
        parts({"type": "image_url", "image_url": {"url": "data:image/png;base64,iV"}}),
        {},
        400,
        "messages",
    ),
    (
        "reasoning_content is a number",
        CHAT,
        message(reasoning_content=3),
        {},
        400,
        "messages.0.reasoning_content",
    ),
    ("reasoning_effort is a number", CHAT, with_(reasoning_effort=2), {}, 400, "reasoning_effort"),
    # structured output
    (
        "response_format type is unknown",
        CHAT,
        with_(response_format={"type": "xml"}),
        {},
        400,
        "response_format.type",
    ),
    (
        "response_format is a string",
        CHAT,
        with_(response_format="json"),
        {},
        400,
        "response_format",
    ),
    (
        "json_schema without its object",
        CHAT,
        with_(response_format={"type": "json_schema"}),
        {},
        400,
        "response_format",
    ),
    (
        "json_schema's schema is a list",
        CHAT,
        schema_format([1]),
        {},
        400,
        "response_format.json_schema.schema",
    ),
    (
        "a schema of an unknown type",
        CHAT,
        schema_format({"type": "object", "properties": {"a": {"type": "integr"}}}),
        {},
        400,
        "response_format",
    ),
    (
        "a strict tool's parameters break",
        CHAT,
        with_(
            tools=[
                {
                    "type": "function",
                    "function": {"name": "ls", "strict": True, "parameters": {"type": "nope"}},
                }
            ],
            tool_choice="required",
        ),
        {},
        400,
        "tools",
    ),
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
    ("repetition_penalty of 0", CHAT, with_(repetition_penalty=0), {}, 400, "repetition_penalty"),
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
    ("logprobs is 6", LEGACY, legacy(logprobs=6), {}, 400, "logprobs"),
    ("logprobs is -1", LEGACY, legacy(logprobs=-1), {}, 400, "logprobs"),
    ("logprobs with echo", LEGACY, legacy(logprobs=1, echo=True), {}, 400, "logprobs"),
    ("top_logprobs is 21", CHAT, with_(logprobs=True, top_logprobs=21), {}, 400, "top_logprobs"),
    ("top_logprobs without logprobs", CHAT, with_(top_logprobs=2), {}, 400, "top_logprobs"),
    ("logprobs is a string", CHAT, with_(logprobs="yes"), {}, 400, "logprobs"),
    (
        "responses: top_logprobs is 21",
        RESPONSES,
        response(top_logprobs=21),
        {},
        400,
        "top_logprobs",
    ),
    ("suffix is set", LEGACY, legacy(suffix="}"), {}, 400, "suffix"),
    ("echo is a string", LEGACY, legacy(echo="yes"), {}, 400, "echo"),
    # the Responses API
    ("responses: body is not JSON", RESPONSES, b"{not json", {}, 400, None),
    ("responses: model missing", RESPONSES, {"input": "Hi"}, {}, 400, "model"),
    ("responses: input is a number", RESPONSES, response(input=5), {}, 400, "input"),
    ("responses: an item is a string", RESPONSES, response(input=["Hi"]), {}, 400, "input.0"),
    (
        "responses: a role is unknown",
        RESPONSES,
        response(input=[{"role": "robot", "content": "Hi"}]),
        {},
        400,
        "input.0.role",
    ),
    (
        "responses: an image part",
        RESPONSES,
        response(input=[{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]),
        {},
        400,
        "input.0.content.0",
    ),
    (
        "responses: call arguments are not JSON",
        RESPONSES,
        response(input=[{"type": "function_call", "name": "f", "call_id": "c", "arguments": "{"}]),
        {},
        400,
        "input.0.arguments",
    ),
    (
        "responses: a tool output without call_id",
        RESPONSES,
        response(input=[{"type": "function_call_output", "output": "x"}]),
        {},
        400,
        "input.0.call_id",
    ),
    (
        "responses: a content that is a number",
        RESPONSES,
        response(input=[{"type": "message", "role": "user", "content": 5}]),
        {},
        400,
        "input.0.content",
    ),
    (
        "responses: a call without its call_id",
        RESPONSES,
        response(input=[{"type": "function_call", "name": "f", "arguments": "{}"}]),
        {},
        400,
        "input.0",
    ),
    (
        "responses: previous_response_id unknown",
        RESPONSES,
        response(previous_response_id="resp_" + "0" * 32),
        {},
        400,
        "previous_response_id",
    ),
    (
        "responses: previous_response_id is not an id",
        RESPONSES,
        response(previous_response_id="../../etc/passwd"),
        {},
        400,
        "previous_response_id",
    ),
    (
        "responses: previous_response_id is too long",
        RESPONSES,
        response(previous_response_id="resp_" + "0" * 100),
        {},
        400,
        "previous_response_id",
    ),
    (
        "responses: an unknown reasoning effort type",
        RESPONSES,
        response(reasoning={"effort": 3}),
        {},
        400,
        "reasoning.effort",
    ),
    (
        "responses: text.format type is unknown",
        RESPONSES,
        response(text={"format": {"type": "xml"}}),
        {},
        400,
        "text.format.type",
    ),
    (
        "responses: a strict tool's schema the engine cannot take",
        RESPONSES,
        response(
            tools=[{"type": "function", "name": "f", "strict": True, "parameters": {"type": "x"}}],
            tool_choice="required",
        ),
        {},
        400,
        "tools",
    ),
    (
        "responses: an image part in a tool output",
        RESPONSES,
        response(
            input=[
                {
                    "type": "function_call_output",
                    "call_id": "c",
                    "output": [{"type": "input_image", "image_url": "x"}],
                }
            ]
        ),
        {},
        400,
        "input.0.output.0",
    ),
    ("responses: store is a string", RESPONSES, response(store="yes"), {}, 400, "store"),
    (
        "responses: a function tool without a name",
        RESPONSES,
        response(tools=[{"type": "function", "parameters": {"type": "object"}}]),
        {},
        400,
        "tools.0.name",
    ),
    (
        "responses: a custom tool without a name",
        RESPONSES,
        response(tools=[{"type": "custom"}]),
        {},
        400,
        "tools.0.name",
    ),
    (
        "responses: max_output_tokens is 0",
        RESPONSES,
        response(max_output_tokens=0),
        {},
        400,
        "max_output_tokens",
    ),
    (
        "responses: text.format json_schema without a schema",
        RESPONSES,
        response(text={"format": {"type": "json_schema", "name": "x"}}),
        {},
        400,
        "text.format.schema",
    ),
    (
        "responses: tool_choice names no tool",
        RESPONSES,
        response(tool_choice={"type": "function", "name": "absent"}),
        {},
        400,
        "tool_choice",
    ),
    (
        "responses: reasoning is a string",
        RESPONSES,
        response(reasoning="high"),
        {},
        400,
        "reasoning",
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


def assert_openai_error(
    response: Any, status: int, type_: str | None = "invalid_request_error"
) -> dict[str, Any]:
    """The response is OpenAI's error JSON with this status and type; returns the error."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert set(body) == {"error"}
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert type_ is None or error["type"] == type_
    assert isinstance(error["message"], str) and error["message"]
    assert error["param"] is None or isinstance(error["param"], str)
    if status < 500:  # every 4xx has a code a client can branch on
        assert isinstance(error["code"], str) and error["code"], error
    else:
        assert error["code"] is None or isinstance(error["code"], str)
    return dict(error)


def test_the_table_is_large_and_every_good_request_in_it_would_pass(api: TestClient) -> None:
    assert len(MALFORMED) >= 40
    assert api.post(CHAT, json=GOOD).status_code == 200
    assert api.post(CHAT, json=calls(call(arguments="{}"))).status_code == 200
    assert api.post(LEGACY, json=GOOD_LEGACY).status_code == 200
    assert api.post(RESPONSES, json=GOOD_RESPONSE).status_code == 200


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
    kind = "invalid_request_error" if status == 400 else None
    error = assert_openai_error(api.post(path, content=raw, headers=headers), status, kind)
    assert error["param"] == param


STORED_ROUTES: list[tuple[str, str, str, int, str | None]] = [
    ("an unknown response", "GET", "/v1/responses/resp_" + "0" * 32, 404, None),
    ("a response id that is a path", "GET", "/v1/responses/..%2F..%2Fetc", 404, None),
    ("delete an unknown response", "DELETE", "/v1/responses/resp_" + "1" * 32, 404, None),
    ("input_items of an unknown one", "GET", "/v1/responses/resp_x/input_items", 404, None),
    ("a limit of 0", "GET", "{stored}/input_items?limit=0", 400, "limit"),
    ("a limit past 100", "GET", "{stored}/input_items?limit=101", 400, "limit"),
    ("a limit that is no number", "GET", "{stored}/input_items?limit=ten", 400, "limit"),
    ("an unknown order", "GET", "{stored}/input_items?order=sideways", 400, "order"),
]


@pytest.mark.parametrize(
    ("method", "path", "status", "param"),
    [pytest.param(*row[1:], id=row[0]) for row in STORED_ROUTES],
)
def test_a_bad_stored_response_route_gets_a_4xx_in_openais_shape(
    api: TestClient, method: str, path: str, status: int, param: str | None
) -> None:
    stored = api.post(RESPONSES, json=GOOD_RESPONSE).json()["id"]
    path = path.format(stored=f"/v1/responses/{stored}")
    kind = "invalid_request_error" if status == 400 else None
    error = assert_openai_error(api.request(method, path), status, kind)
    assert error["param"] == param


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("POST", CHAT, with_(max_tokens=0)),
        ("POST", LEGACY, legacy(prompt=5)),
        ("POST", RESPONSES, {"model": "m", "input": 5}),
        ("POST", "/v1/agents", {"agent_id": "no/such/id"}),
        ("GET", "/v1/agents/nobody", None),
    ],
    ids=["chat", "completions", "responses", "agent create", "agent get"],
)
def test_an_openai_route_answers_openais_shape_whatever_headers_it_gets(
    api: TestClient, method: str, path: str, body: dict[str, Any] | None
) -> None:
    """The header that marks an Anthropic SDK (`anthropic-version`; a gateway may forward it)
    picks the error shape only where no route says the protocol: these routes' mid-stream
    errors and answers are OpenAI's, so their 4xx are too."""
    anthropic_headers = {"anthropic-version": "2023-06-01", "x-api-key": "any"}
    answer = api.request(method, path, json=body, headers=anthropic_headers)
    assert_openai_error(answer, answer.status_code, None)
    assert 400 <= answer.status_code < 500


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

    monkeypatch.setattr(openai_api if path == CHAT else completions_api, "chat_usage", bug)
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
    for path in (CHAT, LEGACY, RESPONSES):
        assert {"413", "500", "503"} <= set(paths[path]["post"]["responses"])
