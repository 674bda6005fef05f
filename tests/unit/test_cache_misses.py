"""Why a prompt missed the cache: the position of its first token the cache did not serve and
the reason, on the engine's first event of a request, in its log line, in /admin/cache (one
key's misses never shown to another) and in the `x-semantic-cache-miss` header of every API,
for the misses coding agents lose most time to: a changed timestamp, a tool added, a history
evicted."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from semantic.api.cache_miss import CACHE_MISS_HEADER
from semantic.cache.agents.misses import (
    MISS_NEVER_SEEN,
    MISS_PROMPT_CHANGED,
    MISS_WINDOW_PASSED,
    Lookup,
    MissRecord,
    RecentMisses,
    diagnose,
)
from semantic.cache.agents.stats import MISS_CORRUPT, MISS_EVICTED, MISS_OTHER_MODEL
from semantic.cache.pages.block_pool import BlockPool
from semantic.cache.pages.prefix import PrefixCache, chain_hash, root_hash
from semantic.core import AgentKey, CacheMiss, History, Request, SamplingParams, TokenEvent
from semantic.engine.engine import Engine
from semantic.models.served import ServedModel
from semantic.text.tokenizer import Tokenizer
from tests.unit.fakes import SettledEngine, fake_served, make_engine, running, shared_prefix
from tests.unit.test_agent_cache import SYSTEM, conversation, lose_everything
from tests.unit.test_agent_owners import ALICE_KEY, BOB_KEY, as_, keyed, owner_of
from tests.unit.test_sliding_pages import HYBRID, reclaim_out_of_window_pages


def missed(engine: Engine, agent: str | None, prompt: list[int]) -> tuple[CacheMiss | None, int]:
    """One request, announced: where and why its prompt missed as it arrived, and the tokens
    its usage says came from the cache."""
    request = Request(
        f"{agent}-{len(prompt)}-{id(prompt)}",
        list(prompt),
        SamplingParams(temperature=0.0, max_tokens=4),
        agent_id=agent,
    )
    events: list[TokenEvent] = []
    engine.submit(request, events.append, announce=True)
    engine.run_until_idle()
    arrival, last = events[0], events[-1]
    assert not arrival.token_ids and not arrival.final
    assert last.usage is not None and last.error is None
    return arrival.cache_miss, last.usage.cached_tokens


# -- the diagnosis, over the engine and the fake runner ---------------------------------------


def test_a_continuing_agent_misses_nothing(served: ServedModel, tmp_path: Path) -> None:
    engine, _ = make_engine(served, tmp_path)
    history = conversation(engine, "alice", 2)
    assert missed(engine, "alice", [*history, 300, 301]) == (None, len(history) - 1)
    [cold] = engine.agents.misses.seen_by(lambda owner: True)  # only its first turn missed
    assert (cold["position"], cold["reason"], cold["prompt_tokens"]) == (0, MISS_NEVER_SEEN, 42)


def test_a_token_changed_in_an_agents_system_prompt_is_named_where_it_changed(
    served: ServedModel, tmp_path: Path
) -> None:
    engine, _ = make_engine(served, tmp_path)
    history = conversation(engine, "alice", 1)
    changed = list(history)
    changed[21] += 1  # a timestamp's digit, in the middle of the system prompt's third block
    miss, cached = missed(engine, "alice", [*changed, 300])
    assert miss == CacheMiss(21, MISS_PROMPT_CHANGED) and cached == 21
    *_, record = engine.agents.misses.seen_by(lambda owner: True)
    assert record["agent_id"] == "alice" and record["position"] == 21
    assert record["reason"] == MISS_PROMPT_CHANGED and record["cached_tokens"] == 21


def test_a_history_evicted_from_memory_and_disk_is_named_evicted_from_its_first_token(
    served: ServedModel, tmp_path: Path
) -> None:
    engine, _ = make_engine(served, tmp_path, num_blocks=12, disk_budget_mb=1)
    history = conversation(engine, "alice", 1)
    lose_everything(engine)
    assert missed(engine, "alice", [*history, 300]) == (CacheMiss(0, MISS_EVICTED), 0)


def test_the_disk_remembers_a_block_it_dropped_for_any_prompt_that_repeats_it(
    served: ServedModel, tmp_path: Path
) -> None:
    engine, _ = make_engine(served, tmp_path, num_blocks=12, disk_budget_mb=1)
    prompt = [*SYSTEM, 7, 8, 9]
    missed(engine, None, prompt)
    lose_everything(engine)
    assert missed(engine, None, prompt) == (CacheMiss(0, MISS_EVICTED), 0)


def test_an_anonymous_prompt_is_never_seen_past_what_it_shares(
    served: ServedModel, tmp_path: Path
) -> None:
    engine, _ = make_engine(served, tmp_path)
    assert missed(engine, None, [*SYSTEM, 5, 6]) == (CacheMiss(0, MISS_NEVER_SEEN), 0)
    assert missed(engine, None, [*SYSTEM, 9, 9]) == (CacheMiss(40, MISS_NEVER_SEEN), 40)


def test_an_anonymous_conversation_continued_whole_misses_nothing(
    served: ServedModel, tmp_path: Path
) -> None:
    engine, _ = make_engine(served, tmp_path)
    prompt = [*SYSTEM, 5, 6]
    request = Request("first", prompt, SamplingParams(temperature=0.0, max_tokens=4))
    events: list[TokenEvent] = []
    engine.submit(request, events.append)
    engine.run_until_idle()
    answer = [t for e in events for t in e.token_ids]
    assert missed(engine, None, [*prompt, *answer, 7])[0] is None


def test_an_agent_known_only_to_another_models_cache_is_named_other_model(
    tiny_tokenizer: Tokenizer, tmp_path: Path
) -> None:
    engine, _ = make_engine(fake_served(tiny_tokenizer, name="model-a"), tmp_path)
    history = conversation(engine, "alice", 1)
    engine.stop()
    other, _ = make_engine(fake_served(tiny_tokenizer, name="model-b"), tmp_path)
    assert missed(other, "alice", [*history, 300]) == (CacheMiss(0, MISS_OTHER_MODEL), 0)


def test_a_damaged_block_file_is_named_corrupt(served: ServedModel, tmp_path: Path) -> None:
    engine, _ = make_engine(served, tmp_path)
    history = conversation(engine, "alice", 1)
    engine.stop()
    first = engine.agents.by_key[AgentKey("alice")].block_hashes[0]
    (engine.tiering.disk.blocks_dir / f"{first:016x}.safetensors").write_bytes(b"")  # quarantined
    restarted, _ = make_engine(served, tmp_path)
    assert missed(restarted, "alice", [*history, 300]) == (CacheMiss(0, MISS_CORRUPT), 0)


def test_a_prefix_whose_sliding_pages_were_reclaimed_is_named_window_passed(
    served: ServedModel, tmp_path: Path
) -> None:
    engine, _ = make_engine(served, tmp_path, num_blocks=256, layer_windows=HYBRID)
    first = [3 + k % 300 for k in range(40 * 8)]
    missed(engine, "alice", first)
    missed(engine, "bob", [*first[:160], 301, 302])
    assert reclaim_out_of_window_pages(engine) > 0
    other = [*first[:152], 304, 305]
    assert missed(engine, "carol", other) == (CacheMiss(0, MISS_WINDOW_PASSED), 0)


def test_the_recent_misses_are_a_bounded_list_newest_last() -> None:
    misses = RecentMisses(size=3)
    for i in range(5):
        request = Request(f"r{i}", [1, 2, 3], SamplingParams())
        misses.add(MissRecord.of(request, CacheMiss(i, MISS_NEVER_SEEN), 0, 0.0))
    assert [r["request_id"] for r in misses.seen_by(lambda owner: True)] == ["r2", "r3", "r4"]


def test_the_log_line_of_a_missed_request_names_the_agent_position_and_reason(
    served: ServedModel, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    engine, _ = make_engine(served, tmp_path)
    history = conversation(engine, "alice", 1)
    changed = list(history)
    changed[3] += 1
    with caplog.at_level(logging.INFO, logger="semantic.engine.engine"):
        missed(engine, "alice", [*changed, 300])
    [line] = [r for r in caplog.records if r.getMessage() == "request finished"]
    assert line.agent_id == "alice"  # type: ignore[attr-defined]
    assert line.cache_miss_position == 3  # type: ignore[attr-defined]
    assert line.cache_miss_reason == MISS_PROMPT_CHANGED  # type: ignore[attr-defined]


def lookup_without_cache(prompt: list[int], history: list[int]) -> Lookup:
    """`prompt` against an empty pool, for an agent whose last history was `history` (its
    blocks gone, and forgotten by the disk)."""
    prefix = PrefixCache(BlockPool(8), 8, root_hash("tiny"))
    full = len(history) // 8 * 8
    hashes = prefix.chain(history[:full], prefix.root)
    tail = chain_hash(hashes[-1], history[full:]) if len(history) > full else None
    history_of = History(hashes, tail, len(history))
    return Lookup(prompt, prefix.match(prompt, prefix.root), prefix.root, history_of)


@pytest.mark.parametrize("length", [24, 21], ids=["whole-blocks", "with-a-tail"])
def test_a_history_the_disk_forgot_is_still_named_evicted_by_the_agent(length: int) -> None:
    history = list(range(10, 10 + length))
    lookup = lookup_without_cache([*history, 1, 2], history)
    assert diagnose(lookup, lambda h: None, lambda: False) == CacheMiss(0, MISS_EVICTED)


def test_a_prompt_that_parts_from_a_forgotten_history_is_named_where_its_block_starts() -> None:
    """The block where the prompt parts is gone: its tokens are not there to compare, so the
    position is that block's start, and the reason the change (evicted or not, the prompt
    would not have been served past it)."""
    history = list(range(10, 31))  # two blocks and a 5-token tail
    lookup = lookup_without_cache([*history[:3], 99, *history[4:], 1, 2], history)
    assert diagnose(lookup, lambda h: None, lambda: False) == CacheMiss(0, MISS_PROMPT_CHANGED)


# -- through the HTTP APIs ---------------------------------------------------------------------


def submitted(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> list[list[int]]:
    """The prompts the routes hand `engine`, in order."""
    prompts: list[list[int]] = []
    submit = engine.submit

    def spy(request: Request, *args: Any, **kwargs: Any) -> None:
        prompts.append(list(request.prompt_token_ids))
        submit(request, *args, **kwargs)

    monkeypatch.setattr(engine, "submit", spy)
    return prompts


def header(position: int, reason: str) -> str:
    return f"position={position}; reason={reason}"


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_a_changed_timestamp_in_the_system_prompt_is_named_in_the_messages_header(
    chat_served: ServedModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stream: bool
) -> None:
    with running(chat_served, tmp_path, num_blocks=128) as (client, engine, _):
        prompts = submitted(engine, monkeypatch)

        def ask(now: str) -> Any:
            system = f"You are a coding agent. Current time: {now}. Answer briefly."
            body = {
                "model": "tiny",
                "max_tokens": 4,
                "stream": stream,
                "system": system,
                "messages": [{"role": "user", "content": "List the files."}],
            }
            response = client.post("/v1/messages", json=body, headers={"x-session-id": "coder"})
            assert response.status_code == 200, response.text
            return response

        assert ask("2026-11-28 14:52:07").headers[CACHE_MISS_HEADER] == header(0, MISS_NEVER_SEEN)
        second = ask("2026-11-28 14:53:41")
    position = shared_prefix(prompts[0], prompts[1])
    assert second.headers[CACHE_MISS_HEADER] == header(position, MISS_PROMPT_CHANGED)
    before = chat_served.tokenizer.decode(prompts[1][:position])
    assert "Current time: 2026-11-28 14:" in before and "14:53" not in before
    if not stream:
        assert second.json()["usage"]["cache_read_input_tokens"] == position


def test_a_tool_added_is_named_in_the_chat_completions_header(
    qwen: ServedModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def tool(name: str) -> dict[str, Any]:
        parameters = {"type": "object", "properties": {"path": {"type": "string"}}}
        function = {"name": name, "description": f"{name} a file", "parameters": parameters}
        return {"type": "function", "function": function}

    messages = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Fix the failing test."},
    ]
    body = {"model": "tiny", "max_tokens": 4, "messages": messages, "session_id": "coder"}
    with running(qwen, tmp_path, num_blocks=256) as (client, engine, _):
        prompts = submitted(engine, monkeypatch)
        first = client.post("/v1/chat/completions", json=body | {"tools": [tool("read_file")]})
        assert first.status_code == 200, first.text
        tools = [tool("read_file"), tool("write_file")]
        second = client.post("/v1/chat/completions", json=body | {"tools": tools, "stream": True})
        assert second.status_code == 200, second.text
    position = shared_prefix(prompts[0], prompts[1])
    assert second.headers[CACHE_MISS_HEADER] == header(position, MISS_PROMPT_CHANGED)
    before = qwen.tokenizer.decode(prompts[1][:position])
    assert "read_file" in before and "write_file" not in before


def evict_everything(client: TestClient, engine: SettledEngine, key: str) -> None:
    """Named agents' prompts that fill the pool, with no disk to keep what they push out."""
    engine.tiering.disk.budget_bytes = 0
    for other in range(8):
        content = f"filler {other} " + " ".join(f"w{other}x{k}" for k in range(40))
        body = {
            "model": "tiny",
            "max_tokens": 2,
            "messages": [{"role": "user", "content": content}],
        }
        headers = as_(key) | {"x-session-id": f"filler-{other}"}
        assert client.post("/v1/chat/completions", json=body, headers=headers).status_code == 200
    engine.tiering.writer.flush(10)


def test_an_evicted_prefix_is_named_in_the_header_and_admin_cache_shows_each_key_its_own(
    chat_served: ServedModel, tmp_path: Path
) -> None:
    messages = [
        {"role": "system", "content": "The launch code is swordfish."},
        {"role": "user", "content": "Hello."},
    ]
    body = {"model": "tiny", "max_tokens": 3, "messages": messages, "session_id": "coder"}
    with keyed(chat_served, tmp_path, admin_api_key=[]) as (client, engine):  # keys see own
        first = client.post("/v1/chat/completions", json=body, headers=as_(ALICE_KEY))
        answer = first.json()["choices"][0]["message"]["content"]
        evict_everything(client, engine, BOB_KEY)
        answered = [*messages, {"role": "assistant", "content": answer}]
        again = body | {"messages": [*answered, {"role": "user", "content": "And now?"}]}
        second = client.post("/v1/chat/completions", json=again, headers=as_(ALICE_KEY))
        assert second.headers[CACHE_MISS_HEADER] == header(0, MISS_EVICTED)
        seen = {key: client.get("/admin/cache", headers=as_(key)) for key in (ALICE_KEY, BOB_KEY)}
    misses = {key: response.json()["recent_misses"] for key, response in seen.items()}
    assert {m["owner"] for m in misses[ALICE_KEY]} == {owner_of(ALICE_KEY)}
    assert {m["owner"] for m in misses[BOB_KEY]} == {owner_of(BOB_KEY)}
    assert misses[ALICE_KEY][-1] | {"at": 0, "request_id": ""} == {
        "at": 0,
        "request_id": "",
        "agent_id": "coder",
        "owner": owner_of(ALICE_KEY),
        "prompt_tokens": misses[ALICE_KEY][-1]["prompt_tokens"],
        "cached_tokens": 0,
        "position": 0,
        "reason": MISS_EVICTED,
    }
    assert all("swordfish" not in response.text for response in seen.values())


@pytest.fixture
def app(chat_served: ServedModel, tmp_path: Path) -> Iterator[TestClient]:
    with running(chat_served, tmp_path) as (client, _, _):
        yield client


@pytest.mark.parametrize(
    ("route", "body"),
    [
        ("/v1/completions", {"prompt": "Once upon a time"}),
        ("/v1/responses", {"input": "Once upon a time"}),
    ],
)
def test_every_api_names_a_cold_prompts_miss(app: TestClient, route: str, body: dict) -> None:
    response = app.post(route, json={"model": "tiny", "max_tokens": 2} | body)
    assert response.status_code == 200, response.text
    assert response.headers[CACHE_MISS_HEADER] == header(0, MISS_NEVER_SEEN)


def test_the_agent_api_names_a_cold_turns_miss_and_not_a_warm_ones(app: TestClient) -> None:
    assert app.post("/v1/agents", json={"agent_id": "coder"}).status_code == 201
    turn = {"message": "Hello there.", "max_tokens": 2}
    cold = app.post("/v1/agents/coder/generate", json=turn)
    assert cold.headers[CACHE_MISS_HEADER] == header(0, MISS_NEVER_SEEN)
    warm = app.post("/v1/agents/coder/generate", json=turn)
    assert warm.status_code == 200 and CACHE_MISS_HEADER not in warm.headers


def test_openapi_declares_the_header_on_every_generation_route(app: TestClient) -> None:
    paths = app.get("/openapi.json").json()["paths"]
    routes = [
        "/v1/messages",
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/responses",
        "/v1/agents/{agent_id}/generate",
    ]
    for route in routes:
        assert CACHE_MISS_HEADER in paths[route]["post"]["responses"]["200"]["headers"], route
