"""Request limits over the fake runner, each a setting: messages, tools, prompt tokens, output
tokens and the body's size, refused with a 400 (413 for the body) in each protocol's shape that
names the field; /v1/messages clamps max_tokens instead, as Claude Code needs."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from starlette.types import Message

from semantic.api.app import create_app
from semantic.models.served import ServedModel
from tests.unit.fakes import asgi_scope, chat_app, make_engine, with_chatml

pytestmark = pytest.mark.usefixtures("no_outside_settings")

ANTHROPIC = "/v1/messages"
COUNT = "/v1/messages/count_tokens"
OPENAI = "/v1/chat/completions"
LEGACY = "/v1/completions"
HI = {"role": "user", "content": "Hi"}
BODY: dict[str, Any] = {"model": "tiny", "max_tokens": 2, "messages": [HI]}
LONG = "The quick brown fox jumps over the lazy dog. " * 4


def anthropic_error(response: Any, status: int = 400) -> str:
    assert response.status_code == status, response.text
    body = response.json()
    assert body["type"] == "error"
    return str(body["error"]["message"])


def openai_error(response: Any, status: int = 400) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error: dict[str, Any] = response.json()["error"]
    return error


def anthropic_tool(name: str) -> dict[str, Any]:
    return {"name": name, "input_schema": {"type": "object"}}


def openai_tool(name: str) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "parameters": {"type": "object"}}}


def test_more_messages_than_max_messages_is_a_400_naming_messages(
    served: ServedModel, tmp_path: Path
) -> None:
    three = {**BODY, "messages": [HI, {"role": "assistant", "content": "Hello"}, HI]}
    with chat_app(served, tmp_path, max_messages=2) as client:
        for path in (ANTHROPIC, COUNT):
            assert anthropic_error(client.post(path, json=three)).startswith("messages: 3 messages")
        error = openai_error(client.post(OPENAI, json=three))
        assert error["param"] == "messages" and "at most 2 (max_messages)" in error["message"]
        assert client.post(OPENAI, json={**BODY, "messages": three["messages"][:2]}).is_success


def test_more_tools_than_max_tools_is_a_400_naming_tools(
    served: ServedModel, tmp_path: Path
) -> None:
    # Room for the tool prompt the fake model's template adds.
    with chat_app(served, tmp_path, max_tools=1, num_blocks=128) as client:
        two = {**BODY, "tools": [anthropic_tool("a"), anthropic_tool("b")]}
        assert anthropic_error(client.post(ANTHROPIC, json=two)).startswith("tools: 2 tools")
        assert anthropic_error(client.post(COUNT, json=two)).startswith("tools: 2 tools")
        error = openai_error(client.post(OPENAI, json={**BODY, "tools": [openai_tool("a")] * 2}))
        assert error["param"] == "tools"
        one = client.post(OPENAI, json={**BODY, "tools": [openai_tool("a")]})
        assert one.is_success, one.text


def test_tools_inside_a_responses_namespace_count_against_max_tools(
    served: ServedModel, tmp_path: Path
) -> None:
    """Before, a namespace counted as one tool, so one could carry any number past the limit."""
    function = {"type": "function", "parameters": {"type": "object"}}
    tools = [{**function, "name": name} for name in ("a", "b")]
    namespace = {"type": "namespace", "name": "ns", "tools": tools}
    body = {"model": "tiny", "max_output_tokens": 2, "input": "Hi"}
    with chat_app(served, tmp_path, max_tools=1, num_blocks=128) as client:
        error = openai_error(client.post("/v1/responses", json={**body, "tools": [namespace]}))
        assert error["param"] == "tools" and error["message"].startswith("tools: 2 tools")
        one = {**namespace, "tools": tools[:1]}
        assert client.post("/v1/responses", json={**body, "tools": [one]}).is_success


def test_a_prompt_over_max_prompt_tokens_is_a_context_overflow(
    served: ServedModel, tmp_path: Path
) -> None:
    long = {**BODY, "messages": [{"role": "user", "content": LONG}]}
    with chat_app(served, tmp_path, max_prompt_tokens=20) as client:
        # Anthropic's own words, which Claude Code answers by compacting.
        message = anthropic_error(client.post(ANTHROPIC, json=long))
        assert message.startswith("prompt is too long: ") and message.endswith("> 20 maximum")
        error = openai_error(client.post(OPENAI, json=long))
        assert (error["param"], error["code"]) == ("messages", "context_length_exceeded")
        assert "at most 20 (max_prompt_tokens)" in error["message"]
        legacy = {"model": "tiny", "prompt": LONG, "max_tokens": 2}
        assert openai_error(client.post(LEGACY, json=legacy))["param"] == "prompt"
        assert client.post("/v1/agents", json={"agent_id": "bot"}).status_code == 201
        turn = client.post("/v1/agents/bot/generate", json={"message": LONG, "max_tokens": 2})
        assert openai_error(turn)["param"] == "message"
        # Counting a prompt is never refused for its length, and a short one is served.
        assert client.post(COUNT, json=long).json()["input_tokens"] > 20
        assert client.post(ANTHROPIC, json=BODY).status_code == 200


def test_openai_max_tokens_over_max_output_tokens_is_a_400_naming_the_field(
    served: ServedModel, tmp_path: Path
) -> None:
    with chat_app(served, tmp_path, max_output_tokens=3) as client:
        error = openai_error(client.post(OPENAI, json={**BODY, "max_tokens": 4}))
        assert error["param"] == "max_tokens" and "at most 3" in error["message"]
        newer = {**BODY, "max_tokens": None, "max_completion_tokens": 4}
        assert openai_error(client.post(OPENAI, json=newer))["param"] == "max_completion_tokens"
        legacy = {"model": "tiny", "prompt": "Hi", "max_tokens": 4}
        assert openai_error(client.post(LEGACY, json=legacy))["param"] == "max_tokens"
        assert client.post("/v1/agents", json={"agent_id": "bot"}).status_code == 201
        turn = client.post("/v1/agents/bot/generate", json={"message": "Hi", "max_tokens": 4})
        assert openai_error(turn)["param"] == "max_tokens"


def test_defaults_are_cut_to_max_output_tokens(served: ServedModel, tmp_path: Path) -> None:
    """The fake runner never samples end-of-text, so an answer is as long as its budget."""
    with chat_app(served, tmp_path, max_output_tokens=3, default_max_tokens=50) as client:
        chat = client.post(OPENAI, json={**BODY, "max_tokens": None}).json()
        assert chat["usage"]["completion_tokens"] == 3
        client.post("/v1/agents", json={"agent_id": "bot", "defaults": {"max_tokens": 40}})
        turn = client.post("/v1/agents/bot/generate", json={"message": "Hi"}).json()
        assert turn["usage"]["completion_tokens"] == 3


def test_anthropic_max_tokens_is_clamped_to_max_output_tokens(
    served: ServedModel, tmp_path: Path
) -> None:
    with chat_app(served, tmp_path, max_output_tokens=3) as client:
        reply = client.post(ANTHROPIC, json={**BODY, "max_tokens": 32000})
        assert reply.status_code == 200, reply.text
        assert reply.json()["usage"]["output_tokens"] == 3
        assert reply.json()["stop_reason"] == "max_tokens"  # not a full context: no compaction


def test_every_route_with_a_body_takes_at_most_max_body_mb(
    served: ServedModel, tmp_path: Path
) -> None:
    big = "x" * 2**20
    with chat_app(served, tmp_path, max_body_mb=1) as client:
        agent = {"agent_id": "bot", "system": big}
        assert openai_error(client.post("/v1/agents", json=agent), 413)["message"].startswith(
            "request body is"
        )
        turn = client.post("/v1/agents/nobody/generate", json={"message": big})
        assert turn.status_code == 413
        assert client.post("/admin/cache/persist", json={"agents": [big]}).status_code == 413
        long = {**BODY, "messages": [{"role": "user", "content": big}]}
        assert anthropic_error(client.post(ANTHROPIC, json=long), 413)
        assert client.post("/v1/agents", json={"agent_id": "bot"}).status_code == 201


def test_stop_strings_past_their_count_or_length_are_a_400_naming_the_field(
    served: ServedModel, tmp_path: Path
) -> None:
    """Every stop string is matched against every token on the engine thread, so how many a
    request gives and how long each is are bounded, in every API."""
    three = ["a", "b", "c"]
    long = "x" * 11
    with chat_app(served, tmp_path, max_stop_sequences=2, max_stop_sequence_chars=10) as client:
        for stops, said in ((three, "3 stop sequences"), ([long], "of 11 characters")):
            answer = client.post(ANTHROPIC, json={**BODY, "stop_sequences": stops})
            message = anthropic_error(answer)
            assert message.startswith("stop_sequences: ") and said in message
            for path, body in ((OPENAI, BODY), (LEGACY, {"model": "tiny", "prompt": "Hi"})):
                error = openai_error(client.post(path, json={**body, "stop": stops}))
                assert error["param"] == "stop" and said in error["message"]
            created = client.post("/v1/agents", json={"defaults": {"stop": stops}})
            assert openai_error(created)["param"] == "defaults.stop"
        assert client.post("/v1/agents", json={"agent_id": "bot"}).status_code == 201
        turn = client.post("/v1/agents/bot/generate", json={"message": "Hi", "stop": [long]})
        assert openai_error(turn)["param"] == "stop"
        ok = ["x" * 10, "y"]
        assert client.post(ANTHROPIC, json={**BODY, "stop_sequences": ok}).status_code == 200
        assert client.post(OPENAI, json={**BODY, "stop": ok}).status_code == 200


def test_by_default_a_request_takes_16_stop_strings_of_256_characters(
    served: ServedModel, tmp_path: Path
) -> None:
    with chat_app(served, tmp_path) as client:
        most = [f"{i:03}" + "x" * 253 for i in range(16)]
        assert client.post(ANTHROPIC, json={**BODY, "stop_sequences": most}).status_code == 200
        more = anthropic_error(
            client.post(ANTHROPIC, json={**BODY, "stop_sequences": [*most, "y"]})
        )
        assert "at most 16 (max_stop_sequences)" in more
        longer = openai_error(client.post(OPENAI, json={**BODY, "stop": ["x" * 257]}))
        assert "at most 256 (max_stop_sequence_chars)" in longer["message"]


CHUNK = 2**18  # a quarter of a MiB


class EndlessBody:
    """The server's side of a client sending a body that does not end (a chunked upload of
    gigabytes), counting what the app reads; it stops after `most` parts, so that an app
    that reads to the end still returns."""

    def __init__(self, most: int = 200) -> None:
        self.reads = 0
        self.most = most
        self.statuses: list[int] = []

    async def receive(self) -> dict[str, Any]:
        self.reads += 1
        more = self.reads < self.most
        return {"type": "http.request", "body": b" " * CHUNK, "more_body": more}

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.statuses.append(message["status"])


def test_a_body_is_read_no_further_than_the_limit(served: ServedModel, tmp_path: Path) -> None:
    """A chunked body is refused once it passes `max_body_mb`, a declared one before a byte of
    it is read; either way the connection is closed, since the rest is left unread."""
    engine, _ = make_engine(with_chatml(served), tmp_path, max_body_mb=1)
    app = create_app(engine, engine.settings)

    async def post(path: str, headers: dict[str, str]) -> EndlessBody:
        client = EndlessBody()
        await app(asgi_scope(path, {"host": "127.0.0.1", **headers}), client.receive, client.send)
        return client

    async def scenario() -> None:
        async with app.router.lifespan_context(app):
            for path in (ANTHROPIC, OPENAI, "/v1/agents"):
                chunked = await post(path, {"transfer-encoding": "chunked"})
                assert chunked.statuses == [413] and chunked.reads == 2**20 // CHUNK + 1
                declared = await post(path, {"content-length": str(10**10)})
                assert declared.statuses == [413] and declared.reads == 0

    asyncio.run(scenario())
    with chat_app(served, tmp_path, max_body_mb=1) as client:
        refused = client.post(OPENAI, content=b" " * (2**20 + 1))
        assert refused.status_code == 413 and refused.headers["connection"] == "close"
