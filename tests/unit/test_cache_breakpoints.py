"""Clients' cache hints over the fake runner: Anthropic `cache_control` breakpoints keep their
prefix through a flood of one-off requests and count as Anthropic counts them; malformed ones
are refused as Anthropic refuses them; OpenAI's `prompt_cache_key` and `prompt_cache_retention`
mean the same in Chat Completions as in Responses."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from semantic.api.anthropic_request import MessagesBody, render_prompt
from semantic.api.usage import messages_usage
from semantic.cache.pages.prefix import PrefixCache
from semantic.models.served import ServedModel
from tests.unit.fakes import ManualClock, SettledEngine, running

MODEL = "claude-semantic-test"
BLOCK = 8  # the fake engine's block size
SYSTEM = "You review pull requests for a small team. " * 3


@pytest.fixture
def app(chat_served: ServedModel, tmp_path: Path) -> Iterator[tuple[TestClient, SettledEngine]]:
    with running(chat_served, tmp_path, num_blocks=48) as (client, engine, _):
        yield client, engine


def ask(system: Any, text: str = "Is this change safe?", **fields: Any) -> dict[str, Any]:
    message = {"role": "user", "content": text}
    return {"model": MODEL, "max_tokens": 2, "system": system, "messages": [message]} | fields


def marked(ttl: str | None = None) -> list[dict[str, Any]]:
    control = {"type": "ephemeral"} | ({"ttl": ttl} if ttl else {})
    return [{"type": "text", "text": SYSTEM, "cache_control": control}]


def usage_of(client: TestClient, body: dict[str, Any]) -> dict[str, Any]:
    response = client.post("/v1/messages", json=body)
    assert response.status_code == 200, response.text
    usage: dict[str, Any] = response.json()["usage"]
    counted = client.post("/v1/messages/count_tokens", json=body).json()["input_tokens"]
    read, written = usage["cache_read_input_tokens"], usage["cache_creation_input_tokens"]
    assert usage["input_tokens"] + written + read == counted  # the whole prompt, once
    assert sum(usage["cache_creation"].values()) == written
    return usage


def in_memory(prefix: PrefixCache, body_tokens: list[int], tokens: int) -> bool:
    """Whether the pool holds every full block of the first `tokens` prompt tokens."""
    hashes = prefix.chain(body_tokens[:tokens], prefix.root)
    return all(prefix.pool.lookup(h) is not None for h in hashes)


def flood(client: TestClient, count: int = 12) -> None:
    """One-off requests, each with a prompt of its own, enough to fill the pool many times."""
    for index in range(count):
        text = f"Summarize note {index}: " + f"item {index} is pending review. " * 5
        body = {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": text}]}
        assert client.post("/v1/messages", json=body).status_code == 200


def prompt_ids(engine: SettledEngine, body: dict[str, Any]) -> list[int]:
    return render_prompt(engine.model, MessagesBody.model_validate(body))


def test_a_breakpoint_keeps_its_prefix_through_a_flood_and_the_next_request_reads_it(
    app: tuple[TestClient, SettledEngine],
) -> None:
    client, engine = app
    first = usage_of(client, ask(marked()))
    written = first["cache_creation_input_tokens"]
    assert written > 0 and written % BLOCK == 0 and first["cache_read_input_tokens"] == 0
    assert first["cache_creation"] == {
        "ephemeral_5m_input_tokens": written,
        "ephemeral_1h_input_tokens": 0,
    }
    flood(client)
    assert in_memory(engine.prefix, prompt_ids(engine, ask(marked())), written)
    again = usage_of(client, ask(marked(), "And this one?"))
    assert again["cache_read_input_tokens"] >= written
    assert again["cache_creation_input_tokens"] == 0
    kept = client.get("/admin/cache").json()["breakpoints"]
    assert kept == {"retentions": 1, "tokens": written, "pages_held": written // BLOCK}


def test_without_a_breakpoint_the_same_flood_evicts_the_prefix(
    app: tuple[TestClient, SettledEngine],
) -> None:
    client, engine = app
    plain = ask([{"type": "text", "text": SYSTEM}])
    first = usage_of(client, plain)
    assert first["cache_creation_input_tokens"] == 0  # nothing marked: nothing written
    flood(client)
    assert not in_memory(engine.prefix, prompt_ids(engine, plain), 4 * BLOCK)


def test_1h_breakpoints_before_5m_ones_split_what_they_write(
    app: tuple[TestClient, SettledEngine],
) -> None:
    client, _ = app
    message = {"type": "text", "text": "Review this. " * 8, "cache_control": {"type": "ephemeral"}}
    body = ask(marked("1h")) | {"messages": [{"role": "user", "content": [message]}]}
    usage = usage_of(client, body)
    split = usage["cache_creation"]
    assert split["ephemeral_1h_input_tokens"] > 0 and split["ephemeral_5m_input_tokens"] > 0
    again = usage_of(client, body)  # all it wrote is read back
    assert again["cache_read_input_tokens"] >= usage["cache_creation_input_tokens"]
    assert again["cache_creation_input_tokens"] == 0


def test_the_streamed_usage_splits_the_prompt_as_the_answer_does(
    app: tuple[TestClient, SettledEngine],
) -> None:
    client, _ = app
    with client.stream("POST", "/v1/messages", json=ask(marked()) | {"stream": True}) as stream:
        lines = [line for line in stream.iter_lines() if line.startswith("data: ")]
    events = [json.loads(line.removeprefix("data: ")) for line in lines]
    start = events[0]["message"]["usage"]
    end = next(e for e in events if e["type"] == "message_delta")["usage"]
    assert set(start["cache_creation"].values()) == {0}  # nothing is known before the end
    written, read = end["cache_creation_input_tokens"], end["cache_read_input_tokens"]
    assert end["input_tokens"] + written + read == start["input_tokens"] and written > 0


@pytest.mark.parametrize(
    ("control", "words"),
    [
        ({"type": "ephemeral", "ttl": "10m"}, "'5m' or '1h'"),
        ({"type": "persistent"}, "'ephemeral'"),
    ],
)
def test_a_malformed_cache_control_is_a_400_naming_it(
    app: tuple[TestClient, SettledEngine], control: dict[str, Any], words: str
) -> None:
    client, _ = app
    for block in (
        {"type": "text", "text": SYSTEM, "cache_control": control},
        {"type": "document", "source": {"type": "text", "data": "x"}, "cache_control": control},
    ):
        response = client.post("/v1/messages", json=ask([block]))
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["type"] == "invalid_request_error" and words in error["message"]
        assert "cache_control" in error["message"]


def test_more_than_four_breakpoints_is_a_400(app: tuple[TestClient, SettledEngine]) -> None:
    client, _ = app
    control = {"type": "ephemeral"}
    blocks = [{"type": "text", "text": f"Part {i}.", "cache_control": control} for i in range(5)]
    response = client.post("/v1/messages", json=ask(blocks))
    assert response.status_code == 400
    assert "A maximum of 4 blocks with cache_control" in response.json()["error"]["message"]


def test_a_1h_breakpoint_after_a_5m_one_is_a_400(app: tuple[TestClient, SettledEngine]) -> None:
    client, _ = app
    blocks = [
        {"type": "text", "text": "First.", "cache_control": {"type": "ephemeral"}},
        {"type": "text", "text": "Second.", "cache_control": {"type": "ephemeral", "ttl": "1h"}},
    ]
    response = client.post("/v1/messages", json=ask(blocks))
    assert response.status_code == 400
    assert "must not come after a ttl='5m'" in response.json()["error"]["message"]


def test_breakpoints_past_the_keys_quota_are_a_403_in_anthropics_shape(
    chat_served: ServedModel, tmp_path: Path
) -> None:
    with running(chat_served, tmp_path, num_blocks=48, max_retained_tokens_per_key=16) as (
        client,
        _,
        _,
    ):
        response = client.post("/v1/messages", json=ask(marked()))
    assert response.status_code == 403
    error = response.json()["error"]
    assert error["type"] == "permission_error"
    assert "max_retained_tokens_per_key" in error["message"]


def test_a_retention_goes_away_by_itself_once_its_ttl_has_passed(
    chat_served: ServedModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = ManualClock(now=0.0)  # the retentions' clock
    with running(chat_served, tmp_path, num_blocks=48, max_retention_ttl_s=1.5) as (
        client,
        engine,
        _,
    ):
        monkeypatch.setattr(engine.agents.retentions, "_clock", clock)
        assert usage_of(client, ask(marked()))["cache_creation_input_tokens"] > 0
        assert engine.pool.num_held > 0  # the breakpoint's pages, however long that took
        clock.now = 1.6  # past it: the engine's next sweep (once a second) lets go
        deadline = time.monotonic() + 60  # only so that a broken sweep fails, not hangs
        while engine.pool.num_held and time.monotonic() < deadline:
            time.sleep(0.05)
        assert engine.pool.num_held == 0 and engine.tiering.protected == frozenset()


def test_usage_without_breakpoints_counts_cache_hits_as_reads_and_writes_nothing() -> None:
    assert messages_usage(100, 40, 3) == {
        "input_tokens": 60,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 40,
        "cache_creation": {"ephemeral_5m_input_tokens": 0, "ephemeral_1h_input_tokens": 0},
        "output_tokens": 3,
    }


def test_usage_writes_from_what_was_read_to_the_furthest_breakpoint_split_by_ttl() -> None:
    usage = messages_usage(100, 16, 1, retained=(32, 64), labels=("1h", "5m"))
    assert usage["cache_read_input_tokens"] == 16
    assert usage["cache_creation_input_tokens"] == 48
    assert usage["input_tokens"] == 36
    assert usage["cache_creation"] == {
        "ephemeral_5m_input_tokens": 32,
        "ephemeral_1h_input_tokens": 16,
    }
    read_past = messages_usage(100, 72, 1, retained=(32, 64), labels=("1h", "5m"))
    assert read_past["cache_creation_input_tokens"] == 0 and read_past["input_tokens"] == 28


def test_chat_completions_names_the_conversation_by_prompt_cache_key_as_responses_do(
    app: tuple[TestClient, SettledEngine],
) -> None:
    client, engine = app
    body = {
        "model": MODEL,
        "max_tokens": 2,
        "messages": [{"role": "user", "content": "Hello there"}],
        "prompt_cache_key": "conversation-7",
    }
    assert client.post("/v1/chat/completions", json=body).status_code == 200
    assert [key.agent_id for key in engine.agents.by_key] == ["conversation-7"]


@pytest.mark.parametrize("route", ["/v1/chat/completions", "/v1/responses"])
def test_prompt_cache_retention_24h_keeps_the_prompt_and_in_memory_keeps_nothing_more(
    app: tuple[TestClient, SettledEngine], route: str
) -> None:
    client, engine = app
    text = "Plan the release notes for this week. " * 3
    if route == "/v1/chat/completions":
        body: dict[str, Any] = {"messages": [{"role": "user", "content": text}], "max_tokens": 2}
    else:
        body = {"input": text, "max_output_tokens": 2}
    body |= {"model": MODEL}
    answer = client.post(route, json=body | {"prompt_cache_retention": "in_memory"})
    assert answer.status_code == 200 and len(engine.agents.retentions) == 0
    answer = client.post(route, json=body | {"prompt_cache_retention": "24h"})
    assert answer.status_code == 200 and len(engine.agents.retentions) == 1
    wrong = client.post(route, json=body | {"prompt_cache_retention": "forever"})
    assert wrong.status_code == 400 and "prompt_cache_retention" in wrong.text


def test_a_prompt_that_cannot_run_beside_a_retention_makes_it_let_go_of_its_pages(
    chat_served: ServedModel, tmp_path: Path
) -> None:
    with running(chat_served, tmp_path, num_blocks=32) as (client, engine, _):
        written = usage_of(client, ask(marked()))["cache_creation_input_tokens"]
        assert client.get("/admin/cache").json()["breakpoints"]["pages_held"] == written // BLOCK
        long = "Summarize each of these release notes in one line. " * 4  # most of the pool
        body = {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": long}]}
        answer = client.post("/v1/messages", json=body)
        assert answer.status_code == 200, answer.text
        prompt = answer.json()["usage"]["input_tokens"]
        assert prompt // BLOCK > 32 - written // BLOCK  # it could not have run beside it
        kept = client.get("/admin/cache").json()["breakpoints"]
        assert kept["retentions"] == 1 and kept["pages_held"] == 0  # its files keep it now
        assert engine.tiering.protected  # and the disk budget may not drop them
