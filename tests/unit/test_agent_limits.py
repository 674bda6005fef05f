"""Bounded agents, over the fake runner: at most `max_agents_per_key` per key (a chat agent
makes room by taking the place of an idle one; past that, 403), conversations of at most
`max_conversation_mb` (400), manifests counted in the disk budget, the list in pages, and a
PATCH that never creates an agent."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from semantic.cache.agents.conversation_files import conversation_path
from semantic.cache.agents.manifest import manifest_path
from semantic.cache.disk.tier import DiskTier
from semantic.core import AgentKey, Request, SamplingParams, TokenEvent
from semantic.engine.engine import Engine
from semantic.models.served import ServedModel
from tests.unit.fakes import make_engine, running
from tests.unit.test_agent_api import create, error_of, generate
from tests.unit.test_disk_tier import make_record, open_tier

pytestmark = pytest.mark.usefixtures("no_outside_settings")

MIB = 2**20


def chat_turn(engine: Engine, agent_id: str, prompt: list[int]) -> TokenEvent:
    """One request naming `agent_id` through the engine, without its thread."""
    request = Request(f"{agent_id}-{len(prompt)}", prompt, SamplingParams(max_tokens=2), agent_id)
    events: list[TokenEvent] = []
    engine.submit(request, events.append)
    engine.run_until_idle()
    return events[-1]


# -- agents per key ------------------------------------------------------------------------------


def test_past_the_limit_a_chat_agent_takes_the_place_of_the_least_recently_used(
    served: ServedModel, tmp_path: Path
) -> None:
    engine, _ = make_engine(served, tmp_path, max_agents_per_key=2)
    for agent_id, first in (("a", 10), ("b", 20), ("c", 30)):
        assert chat_turn(engine, agent_id, list(range(first, first + 12))).error is None
    assert set(engine.agents.by_key) == {AgentKey("b"), AgentKey("c")}
    # The forgotten agent's name went, its cache did not: its prompt is still a prefix hit.
    again = chat_turn(engine, "a", [*range(10, 22), 99])
    assert again.usage is not None and again.usage.cached_tokens >= 8
    assert set(engine.agents.by_key) == {AgentKey("c"), AgentKey("a")}


def test_a_limit_lowered_since_the_last_start_holds_for_the_next_new_agent(
    served: ServedModel, tmp_path: Path
) -> None:
    engine, _ = make_engine(served, tmp_path, max_agents_per_key=3)
    for agent_id, first in (("a", 10), ("b", 20), ("c", 30)):
        assert chat_turn(engine, agent_id, list(range(first, first + 12))).error is None
    assert engine.agents.persist(timeout=10).agents_saved == 3
    lowered, _ = make_engine(served, tmp_path, max_agents_per_key=1)
    assert len(lowered.agents.by_key) == 3  # read back as they were: none is lost at a start
    assert chat_turn(lowered, "d", list(range(40, 52))).error is None
    assert set(lowered.agents.by_key) == {AgentKey("d")}


def test_agents_with_conversations_never_make_room_so_a_new_one_is_a_403(
    chat_served: ServedModel, tmp_path: Path
) -> None:
    with running(chat_served, tmp_path, max_agents_per_key=2) as (client, _, _):
        create(client, "first")
        create(client, "second")
        refused = error_of(client.post("/v1/agents", json={"agent_id": "third"}), 403)
        assert (
            refused["code"] == "agent_limit_reached" and "max_agents_per_key" in refused["message"]
        )
        assert error_of(client.post("/v1/agents/first/fork"), 403)["code"] == "agent_limit_reached"
        # Nor may a chat request name a new agent: 403 in its own protocol's shape.
        body = {"model": "tiny", "max_tokens": 2, "messages": [{"role": "user", "content": "Hi"}]}
        chat = client.post("/v1/messages", json=body, headers={"x-session-id": "new"})
        assert chat.status_code == 403 and chat.json()["error"]["type"] == "permission_error"
        assert "max_agents_per_key" in chat.json()["error"]["message"]
        assert client.delete("/v1/agents/second").status_code == 200
        assert create(client, "third")["agent_id"] == "third"


# -- conversation size ---------------------------------------------------------------------------


def test_a_conversation_past_max_conversation_mb_is_a_400_and_stays_as_it_was(
    chat_served: ServedModel, tmp_path: Path
) -> None:
    with running(chat_served, tmp_path, max_conversation_mb=1) as (client, _, _):
        huge = client.post("/v1/agents", json={"agent_id": "big", "system": "x" * (MIB + 1)})
        assert error_of(huge, 400)["code"] == "conversation_too_large"
        create(client, "talker", system="x" * (MIB - 100))
        past = client.post("/v1/agents/talker/generate", json={"message": "y" * 200})
        error = error_of(past, 400)
        assert (
            error["code"] == "conversation_too_large" and "max_conversation_mb" in error["message"]
        )
        assert client.get("/v1/agents/talker").json()["generating"] is False  # released
        assert client.get("/v1/agents/talker/messages").json()["data"] == []
        assert error_of(client.get("/v1/agents/big"), 404)


# -- the disk budget -----------------------------------------------------------------------------


def test_manifests_count_in_the_disk_budget(tmp_path: Path) -> None:
    tier = open_tier(tmp_path)
    size = tier.write(make_record(1))
    for block_hash in (2, 3):
        tier.write(make_record(block_hash))
    other = DiskTier(tmp_path, model_tag=tier.model_tag, spec=tier.spec, budget_bytes=3 * size)
    assert other.evict_to_budget() == []  # blocks alone fit
    with_manifests = DiskTier(
        tmp_path,
        model_tag=tier.model_tag,
        spec=tier.spec,
        budget_bytes=3 * size,
        other_bytes=lambda: size + 1,  # manifests take a block's room and a byte
    )
    assert with_manifests.evict_to_budget() == [1, 2]
    assert with_manifests.excess_bytes() <= 0


def test_the_engine_counts_its_agents_manifests_and_conversations_against_its_disk_budget(
    chat_served: ServedModel, tmp_path: Path
) -> None:
    with running(chat_served, tmp_path) as (client, engine, _):
        create(client, "alice", system="A system prompt that takes some room. " * 5)
        generate(client, "alice", "Hello!")
        create(client, "bob")
        root, disk = engine.tiering.disk.model_root, engine.tiering.disk

        def stored(agent_id: str) -> int:
            agent = engine.agents.by_key[AgentKey(agent_id)]
            assert agent.conversation is not None
            conversation = conversation_path(root, agent.conversation.digest())
            return manifest_path(root, agent.key).stat().st_size + conversation.stat().st_size

        alice, bob = stored("alice"), stored("bob")
        assert disk.other_bytes() == alice + bob
        client.delete("/v1/agents/alice")
        assert disk.other_bytes() == bob


# -- the list, in pages --------------------------------------------------------------------------


def page(client: TestClient, **params: Any) -> dict[str, Any]:
    response = client.get("/v1/agents", params=params)
    assert response.status_code == 200, response.text
    return dict(response.json())


def test_the_agent_list_comes_in_pages_in_id_order(
    chat_served: ServedModel, tmp_path: Path
) -> None:
    with running(chat_served, tmp_path) as (client, _, _):
        for agent_id in ["delta", "alpha", "echo", "Charlie", "bravo"]:
            create(client, agent_id)
        first = page(client, limit=2)
        assert [a["agent_id"] for a in first["data"]] == ["Charlie", "alpha"]
        assert (first["first_id"], first["last_id"], first["has_more"]) == (
            "Charlie",
            "alpha",
            True,
        )
        second = page(client, limit=2, after=first["last_id"])
        assert [a["agent_id"] for a in second["data"]] == ["bravo", "delta"]
        last = page(client, limit=2, after=second["last_id"])
        assert [a["agent_id"] for a in last["data"]] == ["echo"] and last["has_more"] is False
        assert page(client, after="echo") == {
            "object": "list",
            "data": [],
            "first_id": None,
            "last_id": None,
            "has_more": False,
        }
        assert len(page(client)["data"]) == 5  # 100 by default
        bad_values: list[tuple[str, int | str]] = [("limit", 0), ("limit", 1001), ("after", "../x")]
        for name, bad in bad_values:
            refused = client.get("/v1/agents", params={name: bad})
            assert error_of(refused, 400)["param"] == name


def test_patch_of_an_unknown_agent_is_a_404_and_creates_nothing(
    chat_served: ServedModel, tmp_path: Path
) -> None:
    with running(chat_served, tmp_path) as (client, engine, _):
        missing = client.patch("/v1/agents/nobody", json={"pinned": True})
        assert error_of(missing, 404)["message"] == "no agent 'nobody'"
        assert page(client)["data"] == [] and not engine.agents.by_key
        create(client, "somebody")
        pinned = client.patch("/v1/agents/somebody", json={"pinned": True})
        assert pinned.status_code == 200 and pinned.json()["pinned"] is True
    with running(chat_served, tmp_path) as (client, _, _):  # a pin is durable once answered
        assert client.get("/v1/agents/somebody").json()["pinned"] is True
