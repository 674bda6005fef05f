"""The direct agent API over the fake runner: create, generate (the server keeps the
conversation), fork (a child sharing its parent's blocks), persist, delete; one turn at a time;
and the OpenAPI document. The fake runner's tokens are a hash of the context it reads back, so a
wrong block table or a bad restore changes the answers."""

from __future__ import annotations

import asyncio
import errno
import gc
import json
import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Protocol

import httpx
import pytest
from fastapi.testclient import TestClient

from semantic.api import agent_turn
from semantic.api.agent_turn import Turn
from semantic.api.agents import AgentInfo
from semantic.api.app import create_app
from semantic.backends.fake import FakeRunner
from semantic.cache.agents.conversation import Conversation
from semantic.cache.agents.manifest import load_manifest
from semantic.cache.disk.tier import DiskTier
from semantic.cache.pages.block_pool import TIER_SHARED
from semantic.core import AgentKey, Batch, Caller
from semantic.engine.agent_door import TurnHold
from semantic.engine.engine import Engine
from semantic.engine.runner import StepToken
from semantic.errors import Conflict
from semantic.models.served import ServedModel
from tests.unit import fakes
from tests.unit.fakes import make_engine

BLOCK = 8  # tokens per block in `make_engine`


def running(
    served: ServedModel, cache_dir: Path, **overrides: object
) -> AbstractContextManager[tuple[TestClient, Engine, FakeRunner]]:
    """The whole app, engine thread included (64 blocks of 8 tokens unless overridden)."""
    return fakes.running(served, cache_dir, **({"num_blocks": 64} | overrides))


@pytest.fixture
def api(chat_served: ServedModel, tmp_path: Path) -> Iterator[TestClient]:
    with running(chat_served, tmp_path) as (client, _, _):
        yield client


def create(client: TestClient, agent_id: str, **body: Any) -> dict[str, Any]:
    response = client.post("/v1/agents", json={"agent_id": agent_id, **body})
    assert response.status_code == 201, response.text
    return dict(response.json())


def generate(client: TestClient, agent_id: str, message: str, **body: Any) -> dict[str, Any]:
    response = client.post(
        f"/v1/agents/{agent_id}/generate", json={"message": message, "max_tokens": 5, **body}
    )
    assert response.status_code == 200, response.text
    return dict(response.json())


class Answer(Protocol):
    """A response of the test client or of httpx (two httpx packages, one shape)."""

    @property
    def status_code(self) -> int: ...

    @property
    def text(self) -> str: ...

    def json(self) -> Any: ...


def error_of(response: Answer, status: int) -> dict[str, Any]:
    """The OpenAI-shaped error body of a response that must have `status`."""
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    return dict(body["error"])


def reused_all_it_could(
    reply: dict[str, Any], before: dict[str, Any], from_disk: bool = False
) -> bool:
    """Whether a turn reused the history its agent's previous turn (`before`) left: at least
    that turn's prompt (its answer, tokenized again from text, may differ from the tokens
    generated). From disk, only whole blocks count: a block the new prompt leaves in the middle
    is reused partially from memory only. Never the new prompt's last token (its logits are
    needed)."""
    cached, prompt = reply["usage"]["cached_tokens"], before["usage"]["prompt_tokens"]
    least = prompt // BLOCK * BLOCK if from_disk else prompt
    return least <= cached < reply["usage"]["prompt_tokens"]


def used_blocks(engine: Engine) -> int:
    return engine.pool.num_blocks - engine.pool.num_free


def spy_on_steps(engine: Engine, runner: FakeRunner) -> list[tuple[Batch, list[int]]]:
    """Record each step's batch and, taken on the engine thread as it runs, the refcount of
    every block its first item's table names."""
    seen: list[tuple[Batch, list[int]]] = []
    run = runner.run

    def recorded(batch: Batch) -> list[StepToken]:
        table = batch.items[0].block_tables[0] if batch.items else []
        seen.append((batch, [engine.pool.refcount(block) for block in table]))
        return list(run(batch))

    runner.run = recorded  # type: ignore[method-assign]
    return seen


# -- create ----------------------------------------------------------------------------------


def test_create_answers_201_with_the_agent_and_a_taken_id_is_409(api: TestClient) -> None:
    created = create(api, "alice", system="Be brief.", defaults={"temperature": 0})
    assert created["agent_id"] == "alice" and created["cached_tokens"] == 0
    assert created["conversation"] == {
        "defaults": {"temperature": 0.0},
        "messages": 0,
        "text_bytes": len("Be brief."),
    }
    taken = error_of(api.post("/v1/agents", json={"agent_id": "alice"}), 409)
    assert taken["code"] == "conflict" and "alice" in taken["message"]
    assert api.get("/v1/agents/alice/messages").json()["system"] == "Be brief."


def test_create_without_an_id_generates_one_and_a_bad_id_is_400(api: TestClient) -> None:
    first, second = api.post("/v1/agents").json(), api.post("/v1/agents", json={}).json()
    assert first["agent_id"].startswith("agent_") and first["agent_id"] != second["agent_id"]
    for bad in ["../etc", ".hidden", "a/b", "x" * 129]:
        assert error_of(api.post("/v1/agents", json={"agent_id": bad}), 400)["param"] == "agent_id"
    bad_defaults = api.post("/v1/agents", json={"defaults": {"temperature": 9}})
    assert "temperature" in error_of(bad_defaults, 400)["message"]
    assert error_of(api.post("/v1/agents", json={"defaults": {"max_token": 3}}), 400)


def test_two_creates_of_one_id_at_once_exactly_one_wins(
    chat_served: ServedModel, tmp_path: Path
) -> None:
    engine, _ = make_engine(chat_served, tmp_path)
    app = create_app(engine, engine.settings)

    async def both() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://semantic") as client:
            bodies = [{"agent_id": "twin", "system": f"I am twin {i}."} for i in range(2)]
            return list(await asyncio.gather(*(client.post("/v1/agents", json=b) for b in bodies)))

    engine.start()
    try:
        responses = asyncio.run(both())
    finally:
        engine.stop()
    assert sorted(r.status_code for r in responses) == [201, 409]
    manifest = load_manifest(engine.tiering.disk.model_root, AgentKey("twin"))
    assert manifest is not None and manifest.conversation is not None
    assert manifest.conversation == engine.agents.by_key[AgentKey("twin")].conversation


# -- generate --------------------------------------------------------------------------------


def test_generate_keeps_the_conversation_and_the_next_turn_prefills_only_new_tokens(
    chat_served: ServedModel, tmp_path: Path
) -> None:
    with running(chat_served, tmp_path) as (client, _, runner):
        create(client, "alice", system="You are brief.", defaults={"temperature": 0})
        first = generate(client, "alice", "Hello world!")
        assert first["usage"]["cached_tokens"] == 0 and first["messages"] == 2
        steps_before = len(runner.steps)
        second = generate(client, "alice", "The quick brown fox")
        prefilled = runner.steps[steps_before].items[0].token_ids
    usage = second["usage"]
    assert reused_all_it_could(second, first)
    assert len(prefilled) == usage["prompt_tokens"] - usage["cached_tokens"]
    messages = client_messages(chat_served, tmp_path)
    assert messages["system"] == "You are brief."
    assert messages["data"] == [
        {"role": "user", "content": "Hello world!"},
        {"role": "assistant", "content": first["text"]},
        {"role": "user", "content": "The quick brown fox"},
        {"role": "assistant", "content": second["text"]},
    ]


def client_messages(served: ServedModel, cache_dir: Path) -> dict[str, Any]:
    """The conversation as a restarted server reads it back from disk."""
    with running(served, cache_dir) as (client, _, _):
        response = client.get("/v1/agents/alice/messages")
    assert response.status_code == 200
    return dict(response.json())


def test_a_call_overrides_the_agents_defaults_which_override_the_servers(
    chat_served: ServedModel, tmp_path: Path
) -> None:
    with running(chat_served, tmp_path) as (client, _, runner):
        defaults = {"temperature": 0, "top_p": 0.5, "max_tokens": 3, "stop": ["\n\n"]}
        create(client, "tuned", defaults=defaults)
        by_default = client.post("/v1/agents/tuned/generate", json={"message": "Hi"}).json()
        sampling = runner.steps[-1].items[0].sampling
        assert by_default["usage"]["completion_tokens"] == 3
        assert (sampling.temperature, sampling.top_p, sampling.stop) == (0.0, 0.5, ("\n\n",))
        overridden = generate(client, "tuned", "Again", max_tokens=4, top_p=0.9, stop="!")
        sampling = runner.steps[-1].items[0].sampling
        assert overridden["usage"]["completion_tokens"] == 4
        assert (sampling.temperature, sampling.top_p, sampling.stop) == (0.0, 0.9, ("!",))


def test_a_streamed_turn_sends_deltas_then_done_and_joins_the_conversation(
    api: TestClient,
) -> None:
    create(api, "streamer", defaults={"temperature": 0})
    response = api.post(
        "/v1/agents/streamer/generate", json={"message": "Hello", "stream": True, "max_tokens": 6}
    )
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    events = sse_events(response.text)
    names = [name for name, _ in events]
    assert names[-1] == "done" and set(names[:-1]) == {"delta"}
    done = events[-1][1]
    assert done["text"] == "".join(payload["text"] for _, payload in events[:-1])
    assert done["usage"]["completion_tokens"] == 6 and done["messages"] == 2
    stored = api.get("/v1/agents/streamer/messages").json()["data"]
    assert stored[-1] == {"role": "assistant", "content": done["text"]}


def sse_events(raw: str) -> list[tuple[str, dict[str, Any]]]:
    """`event:` + one `data:` line of JSON whose type is the event's name, then a blank line;
    keep-alive comments are skipped."""
    assert raw.endswith("\n\n") and "\n\n\n" not in raw
    events = []
    for frame in raw[:-2].split("\n\n"):
        if frame.startswith(":"):
            continue
        name_line, data_line = frame.split("\n")
        name, payload = name_line.removeprefix("event: "), json.loads(data_line[len("data: ") :])
        assert payload["type"] == name
        events.append((name, payload))
    return events


def test_generate_on_an_unknown_or_invalid_agent_is_404_or_400(api: TestClient) -> None:
    missing = api.post("/v1/agents/nobody/generate", json={"message": "Hi"})
    assert "nobody" in error_of(missing, 404)["message"]
    # A code a client can branch on, as a duplicate create's "conflict".
    assert error_of(missing, 404)["code"] == "not_found"
    assert error_of(api.get("/v1/agents/nobody"), 404)["code"] == "not_found"
    assert error_of(api.post("/v1/agents/.bad/generate", json={"message": "Hi"}), 400)
    create(api, "alice")
    assert error_of(api.post("/v1/agents/alice/generate", json={"message": ""}), 400)
    assert error_of(api.post("/v1/agents/alice/generate", json={"text": "Hi"}), 400)


def test_a_conversation_that_outgrows_the_context_is_context_length_exceeded(
    chat_served: ServedModel, tmp_path: Path
) -> None:
    with running(chat_served, tmp_path, num_blocks=16) as (client, _, _):  # 128 tokens
        create(client, "chatty")
        too_much = client.post(
            "/v1/agents/chatty/generate", json={"message": "Hi", "max_tokens": 200}
        )
        assert error_of(too_much, 400)["code"] == "context_length_exceeded"
        for turn in range(20):  # the hold was released: turns go on until the history is full
            response = client.post(
                "/v1/agents/chatty/generate",
                json={"message": f"The quick brown fox, turn {turn}", "max_tokens": 8},
            )
            if response.status_code != 200:
                break
        assert error_of(response, 400)["code"] == "context_length_exceeded"
        assert turn > 0
        kept = client.get("/v1/agents/chatty/messages").json()["data"]
        assert len(kept) == 2 * turn  # the refused turn left the conversation as it was


def test_one_turn_at_a_time_a_second_generate_or_a_delete_is_409(
    chat_served: ServedModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine, _ = make_engine(chat_served, tmp_path)
    app = create_app(engine, engine.settings)
    holding, release = threading.Event(), threading.Event()
    render = agent_turn._render

    def slow_render(model: ServedModel, messages: list[dict[str, Any]]) -> list[int]:
        holding.set()  # the first call holds the agent while it renders
        release.wait(30)
        return render(model, messages)

    async def scenario() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://semantic") as client:
            await client.post("/v1/agents", json={"agent_id": "busy"})
            monkeypatch.setattr(agent_turn, "_render", slow_render)
            body = {"message": "Hi", "max_tokens": 3}
            first = asyncio.ensure_future(client.post("/v1/agents/busy/generate", json=body))
            await asyncio.to_thread(holding.wait, 30)
            second = await client.post("/v1/agents/busy/generate", json=body)
            deleted = await client.delete("/v1/agents/busy")
            described = await client.get("/v1/agents/busy")
            release.set()
            monkeypatch.setattr(agent_turn, "_render", render)
            done = await first
            after = await client.post("/v1/agents/busy/generate", json=body)
            return [second, deleted, described, done, after]

    engine.start()
    try:
        second, deleted, described, first, after = asyncio.run(scenario())
    finally:
        engine.stop()
    assert "already generating" in error_of(second, 409)["message"]
    assert error_of(deleted, 409)["code"] == "conflict"
    assert described.json()["generating"] is True
    assert first.status_code == 200 and after.status_code == 200
    assert after.json()["messages"] == 4  # the two turns, one after the other


def test_a_turn_dropped_without_an_answer_releases_its_agent(
    chat_served: ServedModel, tmp_path: Path
) -> None:
    """A stream that never ran (the client left before the 200) drops its `Turn` unfinished:
    collecting it lets the agent go, and that late release never frees a later turn."""
    engine, _ = make_engine(chat_served, tmp_path)
    engine.agents.create(AgentKey("alice"), Conversation(system="Be brief."))

    def hold(turn_id: str) -> TurnHold:
        return engine.agent_door.hold(Caller(None, admin=True), "alice", turn_id)

    async def scenario() -> None:
        dropped = await Turn.begin(engine, hold("turn-1"), "Hi")
        with pytest.raises(Conflict):
            await Turn.begin(engine, hold("turn-2"), "Hi")
        del dropped
        gc.collect()
        later = await Turn.begin(engine, hold("turn-3"), "Hi")  # the release ran first
        engine.agent_door.release_turn(hold("turn-1"))  # late, again
        with pytest.raises(Conflict):
            await Turn.begin(engine, hold("turn-4"), "Hi")
        later.abandon()
        await Turn.begin(engine, hold("turn-5"), "Hi")

    engine.start()
    try:
        asyncio.run(scenario())
    finally:
        engine.stop()


# -- fork ------------------------------------------------------------------------------------


def test_a_fork_shares_its_parents_blocks_and_the_pool_grows_only_by_its_new_tokens(
    chat_served: ServedModel, tmp_path: Path
) -> None:
    with running(chat_served, tmp_path) as (client, engine, runner):
        create(client, "parent", system="You are brief.", defaults={"temperature": 0})
        generate(client, "parent", "Hello world!")
        last = generate(client, "parent", "The quick brown fox")
        parent = engine.agents.by_key[AgentKey("parent")]
        before = used_blocks(engine)
        forked = client.post("/v1/agents/parent/fork", json={"agent_id": "child"})
        assert forked.status_code == 201 and forked.json()["cached_tokens"] == parent.num_tokens
        child = engine.agents.by_key[AgentKey("child")]
        assert child.hashes == parent.hashes and used_blocks(engine) == before  # no block yet
        assert forked.json()["conversation"]["messages"] == 4
        for block_hash in parent.block_hashes:  # two agents name them: the shared tier
            block = engine.pool.lookup(block_hash)
            assert block is not None and engine.pool.tier_of(block) == TIER_SHARED

        parent_blocks = {h: engine.pool.lookup(h) for h in parent.hashes}
        full_blocks = [parent_blocks[h] for h in parent.block_hashes]
        steps = spy_on_steps(engine, runner)
        reply = generate(client, "child", "And then?")
        assert reused_all_it_could(reply, last)
        batch, refcounts = steps[0]
        shared = reply["usage"]["cached_tokens"] // BLOCK
        assert shared >= 1
        # The child's first step runs on the parent's own blocks, each now held once...
        assert batch.items[0].block_tables[0][:shared] == full_blocks[:shared]
        assert refcounts[:shared] == [1] * shared
        # ...and the parent's block it continues in the middle was copied, not written in
        # place (copy-on-write).
        [(source, copy)] = batch.copies
        assert source in parent_blocks.values() and copy not in parent_blocks.values()
        new_hashes = set(child.hashes) - set(parent.hashes)
        assert used_blocks(engine) - before == len(new_hashes)
        # The parent's history, partial tail included, is where it was.
        assert {h: engine.pool.lookup(h) for h in parent.hashes} == parent_blocks

        # The parent still reuses its history; given the child's prompt, it gets the child's
        # answer and reuses the child's new blocks too: the cache is content-addressed.
        same = generate(client, "parent", "And then?")
        assert same["text"] == reply["text"]
        assert same["usage"]["cached_tokens"] >= reply["usage"]["cached_tokens"]


def test_deleting_the_parent_leaves_the_child_its_shared_blocks(
    chat_served: ServedModel, tmp_path: Path
) -> None:
    with running(chat_served, tmp_path) as (client, engine, _):
        create(client, "parent", system="You are brief.", defaults={"temperature": 0})
        generate(client, "parent", "Hello world!")
        generate(client, "parent", "The quick brown fox")
        client.post("/v1/agents/parent/fork", json={"agent_id": "child"})
        last = generate(client, "child", "And then?")
        child_hashes = list(engine.agents.by_key[AgentKey("child")].hashes)
        assert client.delete("/v1/agents/parent").json()["deleted"] is True
        assert all(engine.pool.lookup(h) is not None for h in child_hashes)
        reply = generate(client, "child", "Tell me more.")
    assert reused_all_it_could(reply, last)


def test_a_fork_of_a_parent_whose_blocks_are_only_on_disk(
    chat_served: ServedModel, tmp_path: Path
) -> None:
    with running(chat_served, tmp_path, num_blocks=16) as (client, engine, _):
        create(client, "parent", system="You are brief.", defaults={"temperature": 0})
        last = generate(client, "parent", "Hello world!")
        parent = engine.agents.by_key[AgentKey("parent")]
        for other in range(8):  # other agents' turns push the parent's blocks out of memory
            create(client, f"other-{other}", system=f"Agent {other}: " + "fox " * 20)
            generate(client, f"other-{other}", "The quick brown fox jumps over the lazy dog.")
            if all(engine.pool.lookup(h) is None for h in parent.hashes):
                break
        engine.tiering.writer.flush(10)
        assert all(engine.pool.lookup(h) is None for h in parent.hashes)
        assert all(engine.tiering.disk.contains(h) for h in parent.hashes)
        assert client.post("/v1/agents/parent/fork", json={"agent_id": "child"}).status_code == 201
        reply = generate(client, "child", "And then?")
        stats = client.get("/v1/agents/child").json()
    assert reused_all_it_could(reply, last, from_disk=True)
    # All from disk but the start of the system turn, which other agents' blocks also begin with.
    assert reply["usage"]["cached_tokens"] - BLOCK < stats["disk_hit_tokens"]


def test_a_fork_needs_a_parent_and_a_free_id(api: TestClient) -> None:
    assert error_of(api.post("/v1/agents/nobody/fork"), 404)
    create(api, "parent")
    create(api, "taken")
    assert error_of(api.post("/v1/agents/parent/fork", json={"agent_id": "taken"}), 409)
    assert api.post("/v1/agents/parent/fork").json()["agent_id"].startswith("agent_")


# -- persist and delete ----------------------------------------------------------------------


def test_persist_makes_cache_and_conversation_durable_for_a_server_that_never_shut_down(
    chat_served: ServedModel, tmp_path: Path
) -> None:
    with running(chat_served, tmp_path) as (client, engine, _):
        create(client, "keeper", system="You are brief.", defaults={"temperature": 0})
        generate(client, "keeper", "Hello world!")
        last = generate(client, "keeper", "The quick brown fox")
        persisted = client.post("/v1/agents/keeper/persist")
        assert persisted.status_code == 200 and persisted.json()["durable"] is True
        keeper = engine.agents.by_key[AgentKey("keeper")]
        assert persisted.json()["blocks_written"] <= len(keeper.hashes)  # some written behind
        assert all(engine.tiering.disk.contains(h) for h in keeper.hashes)
        # A second server on the same folder while the first still runs: what a crash now
        # would leave behind.
        with running(chat_served, tmp_path) as (restarted, _, _):
            kept = restarted.get("/v1/agents/keeper/messages").json()["data"]
            reply = generate(restarted, "keeper", "And then?")
            stats = restarted.get("/v1/agents/keeper").json()
    assert [m["role"] for m in kept] == ["user", "assistant"] * 2
    assert reused_all_it_could(reply, last, from_disk=True)
    assert stats["disk_hit_tokens"] == reply["usage"]["cached_tokens"]


def test_persist_of_an_unknown_agent_is_404_and_a_failed_write_is_an_error(
    chat_served: ServedModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with running(chat_served, tmp_path) as (client, _, _):
        assert error_of(client.post("/v1/agents/nobody/persist"), 404)
        create(client, "unlucky")

        def full(self: DiskTier, record: object) -> int:
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(DiskTier, "write", full)
        generate(client, "unlucky", "Hello world!")  # the writes behind the turn fail too
        failed = error_of(client.post("/v1/agents/unlucky/persist"), 500)
        assert failed["code"] == "persist_failed"
        monkeypatch.undo()
        assert client.post("/v1/agents/unlucky/persist").json()["durable"] is True


def test_delete_removes_the_conversation_and_the_id_can_be_created_again(
    chat_served: ServedModel, tmp_path: Path
) -> None:
    with running(chat_served, tmp_path) as (client, engine, _):
        create(client, "phoenix", system="First life.")
        generate(client, "phoenix", "Hello world!")
        assert client.post("/v1/agents/phoenix/persist").status_code == 200
        root = engine.tiering.disk.model_root
        assert load_manifest(root, AgentKey("phoenix")) is not None
        assert client.delete("/v1/agents/phoenix").status_code == 200
        assert load_manifest(root, AgentKey("phoenix")) is None
        assert error_of(client.get("/v1/agents/phoenix/messages"), 404)
        reborn = create(client, "phoenix", system="Second life.")
        assert reborn["conversation"] == {"defaults": {}, "messages": 0, "text_bytes": 12}
        assert client.get("/v1/agents/phoenix/messages").json()["data"] == []
    with running(chat_served, tmp_path) as (client, _, _):  # and so it is after a restart
        described = client.get("/v1/agents/phoenix").json()
        messages = client.get("/v1/agents/phoenix/messages").json()
    assert messages["system"] == "Second life." and messages["data"] == []
    assert described["conversation"]["messages"] == 0


# -- the OpenAPI document --------------------------------------------------------------------


def test_the_openapi_document_describes_the_agent_routes(api: TestClient) -> None:
    paths: dict[str, Any] = api.get("/openapi.json").json()["paths"]
    create_op = paths["/v1/agents"]["post"]
    assert {"201", "400", "409"} <= set(create_op["responses"])
    generate_op = paths["/v1/agents/{agent_id}/generate"]["post"]
    ok = generate_op["responses"]["200"]["content"]
    assert {"application/json", "text/event-stream"} <= set(ok)
    assert ok["application/json"]["schema"]["$ref"].endswith("/Generation")
    assert {"400", "404", "409"} <= set(generate_op["responses"])
    body = generate_op["requestBody"]["content"]["application/json"]["schema"]
    assert body["$ref"].endswith("/GenerateBody")
    assert "201" in paths["/v1/agents/{agent_id}/fork"]["post"]["responses"]
    assert "500" in paths["/v1/agents/{agent_id}/persist"]["post"]["responses"]
    agent_ops = [op for path, ops in paths.items() if path.startswith("/v1/agents") for op in ops]
    assert agent_ops and not any(
        "422" in paths[path][method]["responses"]
        for path in paths
        if path.startswith("/v1/agents")
        for method in paths[path]
    )


def test_a_pin_past_the_keys_share_of_the_pool_is_403_and_pins_nothing(
    chat_served: ServedModel, tmp_path: Path
) -> None:
    with running(chat_served, tmp_path, max_pinned_share=0.01) as (client, engine, _):
        create(client, "big")
        generate(client, "big", "hello there")
        error = error_of(client.patch("/v1/agents/big", json={"pinned": True}), 403)
        assert error["code"] == "pin_limit_reached" and "1%" in error["message"]
        assert client.get("/v1/agents/big").json()["pinned"] is False
        assert engine.pool.num_held == 0


def test_every_field_of_an_agents_description_is_explained_in_the_docs() -> None:
    """docs/clients.md's table of an agent's fields names each one `GET /v1/agents/{id}` answers
    (a newcomer met `working` beside `generating` with neither explained)."""
    page = (Path(__file__).parents[2] / "docs" / "clients.md").read_text()
    table = page[page.index("What an agent's description") :].split("\n\n")[1]
    for field in AgentInfo.model_fields:
        assert f"`{field}`" in table, field
