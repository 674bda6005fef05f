"""Client JSON nests at most `client_json.MAX_DEPTH` deep: deeper is a 400 in the protocol's
shape wherever a client's JSON is read (the body, tool-call arguments in a history, tool
schemas, the model field a swap reads), never a RecursionError that becomes a 500; and its
lone surrogates are mended, so that no route fails on text that UTF-8 cannot hold."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from semantic.api.app import create_app
from semantic.models.served import ServedModel
from semantic.text import client_json
from tests.unit.fakes import make_engine, with_chatml

DEPTH = client_json.MAX_DEPTH
# Deep enough that `json.loads` itself runs out of stack.
ABYSS = "[" * 100_000 + "]" * 100_000


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def test_json_as_deep_as_the_limit_is_read_and_one_level_more_is_refused() -> None:
    assert client_json.loads(nested(DEPTH)) == client_json.loads(nested(DEPTH))
    assert client_json.loads(f'{{"a": {nested(DEPTH - 1)}, "b": 1}}')["b"] == 1
    for deeper in (nested(DEPTH + 1), f'{{"a": {nested(DEPTH)}}}', ABYSS):
        with pytest.raises(client_json.NotJson, match=f"deeper than {DEPTH} levels"):
            client_json.loads(deeper)
    for broken in ("{", b"\xff", "", "[1,]"):
        with pytest.raises(client_json.NotJson, match="is not valid JSON"):
            client_json.loads(broken)


def test_nesting_is_measured_across_every_branch() -> None:
    wide = [[1, {"a": [2]}], {"b": {"c": []}}, "text", 3]
    assert not client_json.nesting_exceeds(wide, 4)
    assert client_json.nesting_exceeds(wide, 3)
    assert not client_json.nesting_exceeds("scalar", 0)


@pytest.fixture
def client(chat_served: ServedModel, tmp_path: Path) -> Any:
    """The app with server errors answered as 500s, as a real server does, not raised."""
    engine, _ = make_engine(chat_served, tmp_path, num_blocks=256)
    with TestClient(create_app(engine, engine.settings), raise_server_exceptions=False) as client:
        yield client


HI = {"role": "user", "content": "Hi"}


def openai_history(arguments: str) -> dict[str, Any]:
    call = {"id": "c1", "type": "function", "function": {"name": "ls", "arguments": arguments}}
    return {
        "model": "tiny",
        "max_tokens": 2,
        "messages": [
            HI,
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": "done"},
        ],
    }


def test_deep_tool_call_arguments_in_an_openai_history_are_a_400(client: TestClient) -> None:
    # Past json.loads' stack, yet under the prompt's character bound (ABYSS is past it, and
    # refused for its length before its arguments are read).
    for arguments in (nested(DEPTH + 1), nested(5_000)):
        answer = client.post("/v1/chat/completions", json=openai_history(arguments))
        assert answer.status_code == 400, answer.text
        error = answer.json()["error"]
        assert error["param"] == "messages" and "deeper than" in error["message"]
    shallow = client.post("/v1/chat/completions", json=openai_history('{"path": "."}'))
    assert shallow.status_code == 200, shallow.text


def deep_bodies(depth: int) -> dict[str, str]:
    """A body per route, with something `depth` deep where a client may put JSON of its own."""
    deep = nested(depth)
    schema = '{"type": "object", "properties": {"a": ' + deep + "}}"
    return {
        "/v1/chat/completions": '{"model": "m", "messages": [{"role": "user", "content": "Hi"}],'
        ' "tools": [{"type": "function", "function": {"name": "ls", "parameters": '
        + schema
        + "}}]}",
        "/v1/messages": '{"model": "m", "max_tokens": 2, "messages": [{"role": "user", '
        '"content": [{"type": "tool_result", "tool_use_id": "t", "content": "x"}]}, '
        '{"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "ls", '
        '"input": {"a": ' + deep + "}}]}]}",
        "/v1/agents": '{"agent_id": "bot", "system": ' + deep + "}",
    }


@pytest.mark.parametrize("depth", [DEPTH + 1, 100_000])
def test_a_body_nested_too_deep_is_a_400_in_each_protocols_shape(
    client: TestClient, depth: int
) -> None:
    for path, body in deep_bodies(depth).items():
        answer = client.post(path, content=body)
        assert answer.status_code == 400, (path, answer.text)
        error = answer.json()["error"]
        assert ("type" in answer.json()) == (path == "/v1/messages")  # Anthropic's shape
        assert (
            error["message"]
            == f"the request body nests arrays and objects deeper than {DEPTH} levels"
        )


def test_a_deep_body_is_refused_before_a_swap_reads_its_model(
    chat_served: ServedModel, tmp_path: Path
) -> None:
    """With swap_on_request the gate reads the body's `model` before the route does."""
    engine, _ = make_engine(with_chatml(chat_served), tmp_path, swap_on_request=True)
    app = create_app(engine, engine.settings)
    with TestClient(app, raise_server_exceptions=False) as client:
        body = '{"model": "tiny", "messages": ' + ABYSS + "}"
        answer = client.post("/v1/chat/completions", content=body)
        assert answer.status_code == 400, answer.text


# A JavaScript string cut mid-emoji: half of a UTF-16 pair, which no UTF-8 text can hold.
LONE = "\\ud83d"


def test_a_lone_surrogate_in_any_string_becomes_a_replacement_character() -> None:
    escaped = '{"k' + LONE + '": ["a' + LONE + '", {"b": "\\udc00c"}], "pair": "\\ud83d\\ude00"}'
    raw_utf8 = '{"k": "\ud800"}'.encode("utf-8", "surrogatepass")  # as json.loads reads bytes
    assert client_json.loads(escaped) == {
        "k\ufffd": ["a\ufffd", {"b": "\ufffdc"}],
        "pair": "\U0001f600",  # a whole pair is one character, kept
    }
    assert client_json.loads(raw_utf8) == {"k": "\ufffd"}
    assert client_json.loads(escaped.encode()) == client_json.loads(escaped)


def surrogate_bodies() -> dict[str, str]:
    """A body per route that takes free text, the text with a lone surrogate in it."""
    return {
        "/v1/completions": '{"model": "m", "max_tokens": 2, "prompt": "cut ' + LONE + '"}',
        "/v1/responses": '{"model": "m", "max_output_tokens": 2, "input": "cut ' + LONE + '"}',
        "/v1/agents": '{"agent_id": "cut", "system": "cut ' + LONE + '"}',
    }


def test_a_lone_surrogate_in_a_body_is_served_and_stored_never_a_500(client: TestClient) -> None:
    """Before, the completions prompt reached the tokenizer as it was, and a stored response
    or an agent's system prompt could not be written out as UTF-8: 500s, and an agent that
    broke the agent list for everyone."""
    for path, body in surrogate_bodies().items():
        answer = client.post(path, content=body)
        assert answer.status_code in (200, 201), (path, answer.text)
    stored = client.get(f"/v1/responses/{answer_id(client)}")
    assert stored.status_code == 200, stored.text
    listed = client.get("/v1/agents")
    assert listed.status_code == 200, listed.text
    assert [agent["agent_id"] for agent in listed.json()["data"]] == ["cut"]
    assert client.get("/v1/agents/cut/messages").json()["system"] == "cut \ufffd"


def answer_id(client: TestClient) -> str:
    body = surrogate_bodies()["/v1/responses"]
    answer = client.post("/v1/responses", content=body)
    assert answer.status_code == 200, answer.text
    response_id: str = answer.json()["id"]
    return response_id
