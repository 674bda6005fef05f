"""The Anthropic Messages API over the fake runner: stream bytes, answers, count_tokens, models.

The fake runner's tokens are a hash of the context it reads back, so the same prompt gives the
same answer streamed or not, cold or cached; it never samples the end token, so every answer
runs to `max_tokens`.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Any

import anthropic
import pytest
from fastapi.testclient import TestClient

from semantic.api import anthropic as messages_api
from semantic.api.reply_stream import ReplyStream
from semantic.api.seal import Seals
from semantic.api.tool_use import ToolChoice, ToolUse
from semantic.core import Batch, TokenEvent
from semantic.engine.engine import ENGINE_FAILED
from semantic.engine.runner import StepToken
from semantic.models.served import ServedModel
from semantic.server_key import ServerKey
from tests.unit.fakes import running

MODEL = "claude-semantic-test"
HELLO = {"model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": "Hello"}]}


@pytest.fixture
def api(chat_served: ServedModel, tmp_path: Path) -> Iterator[TestClient]:
    with running(chat_served, tmp_path) as (client, _, _):
        yield client


@pytest.fixture
def roomy_api(chat_served: ServedModel, tmp_path: Path) -> Iterator[TestClient]:
    """Room for the whole context: tools add the default tool prompt (ChatML has no tools)."""
    with running(chat_served, tmp_path, num_blocks=64) as (client, _, _):
        yield client


def events_of(raw: str) -> list[tuple[str, dict[str, Any]]]:
    """Strict SSE parsing: every event is exactly `event:` + one `data:` line
    of JSON whose type is the event's name, ended by one blank line; nothing else."""
    assert raw.endswith("\n\n") and "\n\n\n" not in raw and "\r" not in raw
    parsed = []
    for frame in raw[:-2].split("\n\n"):
        name_line, data_line = frame.split("\n")
        name = name_line.removeprefix("event: ")
        payload = json.loads(data_line.removeprefix("data: "))
        assert name_line.startswith("event: ") and data_line.startswith("data: ")
        assert payload["type"] == name
        parsed.append((name, payload))
    return parsed


# Anthropic's documented text answer, byte for byte, with the values a run decides left open.
TEXT_STREAM = (
    "event: message_start\n"
    'data: {"type":"message_start","message":{"id":"%(id)s","type":"message",'
    '"role":"assistant","model":"claude-semantic-test","content":[],"stop_reason":null,'
    '"stop_sequence":null,"usage":{"input_tokens":%(prompt)d,"cache_creation_input_tokens":0,'
    '"cache_read_input_tokens":0,"cache_creation":{"ephemeral_5m_input_tokens":0,'
    '"ephemeral_1h_input_tokens":0},"output_tokens":0}}}\n\n'
    "event: ping\n"
    'data: {"type":"ping"}\n\n'
    "event: content_block_start\n"
    'data: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}\n\n'
    "%(deltas)s"
    "event: content_block_stop\n"
    'data: {"type":"content_block_stop","index":0}\n\n'
    "event: message_delta\n"
    'data: {"type":"message_delta","delta":{"stop_reason":"max_tokens","stop_sequence":null},'
    '"usage":{"input_tokens":%(prompt)d,"cache_creation_input_tokens":0,'
    '"cache_read_input_tokens":0,"cache_creation":{"ephemeral_5m_input_tokens":0,'
    '"ephemeral_1h_input_tokens":0},"output_tokens":5}}\n\n'
    "event: message_stop\n"
    'data: {"type":"message_stop"}\n\n'
)
TEXT_DELTA = (
    "event: content_block_delta\n"
    'data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":%s}}\n\n'
)


def test_a_text_stream_is_byte_for_byte_the_protocols_event_sequence(api: TestClient) -> None:
    response = api.post("/v1/messages", json=HELLO | {"stream": True})
    assert response.status_code == 200
    assert response.headers["content-type"] == "text/event-stream; charset=utf-8"
    events = events_of(response.text)
    deltas = [p["delta"]["text"] for name, p in events if name == "content_block_delta"]
    prompt = events[0][1]["message"]["usage"]["input_tokens"]
    expected = TEXT_STREAM % {
        "id": events[0][1]["message"]["id"],
        "prompt": prompt,
        "deltas": "".join(TEXT_DELTA % json.dumps(d, ensure_ascii=False) for d in deltas),
    }
    assert response.text == expected
    count = api.post("/v1/messages/count_tokens", json={"model": MODEL, **HELLO})
    assert prompt == count.json()["input_tokens"]


def test_the_same_request_answers_the_same_text_as_json_and_reads_its_prefix_from_cache(
    api: TestClient,
) -> None:
    streamed = events_of(api.post("/v1/messages", json=HELLO | {"stream": True}).text)
    text = "".join(p["delta"]["text"] for n, p in streamed if n == "content_block_delta")
    response = api.post("/v1/messages", json=HELLO)
    assert response.status_code == 200 and response.headers["request-id"].startswith("req_")
    message = response.json()
    assert set(message) == {
        "id", "type", "role", "model", "content", "stop_reason", "stop_sequence", "usage"
    }  # fmt: skip
    assert message["id"].startswith("msg_") and message["model"] == MODEL
    assert message["content"] == [{"type": "text", "text": text}]
    assert (message["stop_reason"], message["stop_sequence"]) == ("max_tokens", None)
    usage, prompt = message["usage"], streamed[0][1]["message"]["usage"]["input_tokens"]
    assert usage["cache_read_input_tokens"] > 0 and usage["cache_creation_input_tokens"] == 0
    assert usage["input_tokens"] + usage["cache_read_input_tokens"] == prompt
    assert usage["output_tokens"] == 5


def test_the_stream_ends_with_cumulative_usage_split_into_uncached_and_cache_read(
    api: TestClient,
) -> None:
    api.post("/v1/messages", json=HELLO)
    events = events_of(api.post("/v1/messages", json=HELLO | {"stream": True}).text)
    start, (name, delta) = events[0][1]["message"]["usage"], events[-2]
    assert name == "message_delta"
    usage = delta["usage"]
    assert usage["cache_read_input_tokens"] > 0 and usage["output_tokens"] == 5
    assert usage["input_tokens"] + usage["cache_read_input_tokens"] == start["input_tokens"]


def test_an_engine_failure_after_the_200_is_an_error_event_that_ends_the_stream(
    chat_served: ServedModel, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The event says the engine failed, and no more: what failed (here the fake runner's
    injected error) is in the log only."""
    prompt = chat_served.tokenizer.encode(
        chat_served.chat_template.render([{"role": "user", "content": "Hello"}])
    )
    with running(chat_served, tmp_path, fail_on_token=prompt[-1]) as (client, _, _):
        response = client.post("/v1/messages", json=HELLO | {"stream": True})
    assert response.status_code == 200
    names = [name for name, _ in events_of(response.text)]
    assert names == ["message_start", "ping", "error"]
    error = response.text.split("\n\n")[-2]
    assert error == (
        'event: error\ndata: {"type":"error","error":{"type":"api_error",'
        f'"message":"{ENGINE_FAILED}"}}}}'
    )
    assert "injected" not in response.text and "injected runner failure" in caplog.text


def test_a_failure_mid_answer_keeps_the_text_sent_and_ends_with_an_error_event(
    chat_served: ServedModel, tmp_path: Path
) -> None:
    with running(chat_served, tmp_path / "a") as (client, _, runner):
        client.post("/v1/messages", json=HELLO)
    prompt = runner.steps[0].items[0].token_ids
    generated = [step.items[0].token_ids[0] for step in runner.steps[1:]]
    # The runner fails on the first step that reads this token: a decode, after text went out.
    fail = next(t for i, t in enumerate(generated) if i and t not in prompt + generated[:i])
    with running(chat_served, tmp_path / "b", fail_on_token=fail) as (client, _, _):
        response = client.post("/v1/messages", json=HELLO | {"stream": True})
    names = [name for name, _ in events_of(response.text)]
    assert names[:3] == ["message_start", "ping", "content_block_start"]
    assert names[-1] == "error" and "message_stop" not in names
    assert set(names[3:-1]) == {"content_block_delta"}


def test_the_anthropic_sdk_accumulates_the_stream_into_the_json_answer(api: TestClient) -> None:
    sdk = anthropic.Anthropic(base_url=str(api.base_url), api_key="any", http_client=api)
    hello: Any = HELLO
    with sdk.messages.stream(**hello) as stream:
        final = stream.get_final_message()
    whole = sdk.messages.create(**hello)
    assert final.content[0].type == "text" and whole.content[0].type == "text"
    assert final.content[0].text == whole.content[0].text
    assert final.stop_reason == whole.stop_reason == "max_tokens"
    assert final.usage.output_tokens == whole.usage.output_tokens == 5


def test_a_stop_sequence_cuts_the_answer_before_it_and_is_reported(api: TestClient) -> None:
    free = api.post("/v1/messages", json=HELLO | {"max_tokens": 12}).json()
    text = free["content"][0]["text"]
    stop = next(c for c in text[1:] if c.isalnum())
    cut = api.post("/v1/messages", json=HELLO | {"max_tokens": 12, "stop_sequences": [stop]})
    answer = cut.json()
    before = text[: text.index(stop)]
    assert answer["content"] == ([{"type": "text", "text": before}] if before else [])
    assert (answer["stop_reason"], answer["stop_sequence"]) == ("stop_sequence", stop)


def test_max_tokens_0_prewarms_the_cache_and_answers_nothing(api: TestClient) -> None:
    warm = api.post("/v1/messages", json=HELLO | {"max_tokens": 0}).json()
    assert warm["content"] == [] and warm["usage"]["output_tokens"] == 0
    after = api.post("/v1/messages", json=HELLO).json()
    assert after["usage"]["cache_read_input_tokens"] > 0


def test_count_tokens_is_the_prompt_that_messages_prefills(roomy_api: TestClient) -> None:
    api = roomy_api
    body = {
        "model": MODEL,
        "system": [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "Hi"}]},
            {
                "role": "assistant",
                "content": [{"type": "thinking", "thinking": "t", "signature": ""}],
            },
            {"role": "user", "content": "Hello again"},
        ],
        "tools": [{"name": "ls", "input_schema": {"type": "object"}}],
    }
    counted = api.post("/v1/messages/count_tokens?beta=true", json=body)
    assert counted.status_code == 200 and set(counted.json()) == {"input_tokens"}
    usage = api.post("/v1/messages", json=body | {"max_tokens": 1}).json()["usage"]
    cache = usage["cache_read_input_tokens"] + usage["cache_creation_input_tokens"]
    assert counted.json()["input_tokens"] == usage["input_tokens"] + cache


def test_a_prompt_longer_than_the_context_gets_anthropics_overflow_wording(
    api: TestClient,
) -> None:
    long = HELLO | {"messages": [{"role": "user", "content": "Hello world! " * 200}]}
    for stream in (False, True):
        response = api.post("/v1/messages", json=long | {"stream": stream})
        assert response.status_code == 400
        error = response.json()["error"]
        assert error["type"] == "invalid_request_error"
        assert re.fullmatch(r"prompt is too long: \d+ tokens > \d+ maximum", error["message"])


def test_models_answer_in_the_shape_of_the_sdk_that_asks(api: TestClient) -> None:
    anthropic_headers = {"anthropic-version": "2023-06-01"}
    listed = api.get("/v1/models?beta=true&limit=1000", headers=anthropic_headers).json()
    assert set(listed) == {"data", "has_more", "first_id", "last_id"}
    [card] = listed["data"]
    assert card["type"] == "model" and listed["first_id"] == listed["last_id"] == card["id"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", card["created_at"])
    alias = api.get("/v1/models/claude-opus-4-1", headers={"x-api-key": "k"}).json()
    assert alias["type"] == "model" and alias["id"] == "claude-opus-4-1"
    openai_list = api.get("/v1/models").json()
    assert openai_list["object"] == "list" and openai_list["data"][0]["object"] == "model"
    sdk = anthropic.Anthropic(base_url=str(api.base_url), api_key="any", http_client=api)
    assert [m.id for m in sdk.models.list()] == [card["id"]]


def test_both_key_headers_any_version_and_unknown_betas_are_accepted(api: TestClient) -> None:
    for headers in (
        {"x-api-key": "sk-ant-local"},
        {"authorization": "Bearer local-token"},
        {"x-api-key": "a", "authorization": "Bearer b", "anthropic-version": "2026-10-21"},
        {"anthropic-beta": "claude-code-20250219,advisor-tool-2026-03-01,not-a-beta"},
    ):
        response = api.post("/v1/messages?beta=true", json=HELLO, headers=headers)
        assert response.status_code == 200, headers


def test_claude_codes_connectivity_probe_gets_a_200(api: TestClient) -> None:
    assert api.head("/").status_code == 200


def claude_code_user_id(session: str) -> str:
    return json.dumps({"device_id": "d" * 64, "account_uuid": "", "session_id": session})


def agent_ids(api: TestClient) -> list[str]:
    return [agent["agent_id"] for agent in api.get("/v1/agents").json()["data"]]


def test_agents_are_named_by_header_or_by_the_session_in_metadata(roomy_api: TestClient) -> None:
    api = roomy_api
    tools = [{"name": "Bash", "input_schema": {"type": "object"}}]
    session = "0b6f8d52-6a4e-4f0e-9a53-1f6f7c1f2b9e"
    api.post("/v1/messages", json=HELLO, headers={"x-session-id": "by-header"})
    api.post("/v1/messages", json=HELLO | {"metadata": {"user_id": "alice"}})
    user_id = claude_code_user_id(session)
    api.post("/v1/messages", json=HELLO | {"tools": tools, "metadata": {"user_id": user_id}})
    assert sorted(agent_ids(api)) == sorted(["by-header", "alice", session])


def test_claude_code_side_requests_without_tools_do_not_become_the_session(
    api: TestClient,
) -> None:
    metadata = {"user_id": claude_code_user_id("s-1")}
    api.post("/v1/messages", json=HELLO | {"metadata": metadata})
    assert agent_ids(api) == []


def test_pings_keep_a_slow_prefill_alive(
    chat_served: ServedModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with running(chat_served, tmp_path, keep_alive_s=0.02) as (client, _, runner):
        run = runner.run

        def slow(batch: Batch) -> Sequence[StepToken]:
            time.sleep(0.2 if any(not item.sample for item in batch.items) else 0.0)
            return run(batch)

        monkeypatch.setattr(runner, "run", slow)
        long = "Hello world! The quick brown fox jumps over the lazy dog. " * 3
        body = HELLO | {"stream": True, "messages": [{"role": "user", "content": long}]}
        names = [name for name, _ in events_of(client.post("/v1/messages", json=body).text)]
    first_block = names.index("content_block_start")
    assert names[0] == "message_start" and names[1:first_block].count("ping") >= 3
    assert names[-2:] == ["message_delta", "message_stop"]


def test_message_start_and_a_ping_go_out_before_the_engine_says_anything(
    served: ServedModel, tmp_path: Path
) -> None:
    started = asyncio.Event()

    async def silent_engine() -> AsyncIterator[TokenEvent]:
        started.set()
        await asyncio.sleep(3600)
        yield TokenEvent("r", [], "")

    async def first_two() -> list[str]:
        reply = messages_api._Reply(MODEL, 42, 10, Seals(ServerKey(tmp_path), None, 0))
        tools = ToolUse(served, [], ToolChoice())
        stream = reply.events(tools.parse(ReplyStream(silent_engine())), tools)
        head = [await anext(stream), await anext(stream)]
        await stream.aclose()
        return head

    start, ping = asyncio.run(asyncio.wait_for(first_two(), 5))
    assert start.startswith("event: message_start\n") and '"input_tokens":42' in start
    assert ping == 'event: ping\ndata: {"type":"ping"}\n\n'
