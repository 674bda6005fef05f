"""Agents belong to the key that made them, over the fake runner: another key neither sees nor
touches them (404, as for an unknown agent), an admin key sees every key's and reaches them by
owner, two keys naming one session get two agents, ownership outlives a restart, and agents made
before agents had owners are the admins'."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from semantic.cache.agents.manifest import UNOWNED, load_manifest
from semantic.core import AgentKey
from semantic.models.served import ServedModel
from tests.unit.fakes import SettledEngine, running
from tests.unit.test_agent_api import error_of

pytestmark = pytest.mark.usefixtures("no_outside_settings")

ALICE_KEY = "sk-semantic-alice-3c1d"
BOB_KEY = "sk-semantic-bob-8e2a"
ADMIN_KEY = "sk-semantic-admin-0f7b"
CHAT = {"model": "tiny", "max_tokens": 3}


def as_(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def owner_of(key: str) -> str:
    """The owner digest a key's agents carry: the first 128 bits of its SHA-256."""
    return hashlib.sha256(key.encode()).hexdigest()[:32]


@contextmanager
def keyed(
    served: ServedModel, cache_dir: Path, **settings: object
) -> Iterator[tuple[TestClient, SettledEngine]]:
    """The app with two keys, and an admin key unless `settings` say otherwise."""
    keys: dict[str, object] = {"api_key": [ALICE_KEY, BOB_KEY], "admin_api_key": [ADMIN_KEY]}
    with running(served, cache_dir, num_blocks=64, **(keys | settings)) as (client, engine, _):
        yield client, engine


def create(client: TestClient, key: str, agent_id: str, **body: Any) -> dict[str, Any]:
    response = client.post("/v1/agents", json={"agent_id": agent_id, **body}, headers=as_(key))
    assert response.status_code == 201, response.text
    return dict(response.json())


def listed(client: TestClient, key: str, **params: str) -> list[tuple[str, str | None]]:
    response = client.get("/v1/agents", params=params, headers=as_(key))
    assert response.status_code == 200, response.text
    return [(agent["agent_id"], agent["owner"]) for agent in response.json()["data"]]


def test_another_key_gets_404_for_an_agent_and_does_not_list_it(
    chat_served: ServedModel, tmp_path: Path
) -> None:
    with keyed(chat_served, tmp_path, admin_api_key=[]) as (client, _):
        created = create(client, ALICE_KEY, "alice", system="Alice's secret plan.")
        assert created["owner"] == owner_of(ALICE_KEY)
        turn = {"message": "Hi", "max_tokens": 3}
        mine = client.post("/v1/agents/alice/generate", json=turn, headers=as_(ALICE_KEY))
        assert mine.status_code == 200
        bob = as_(BOB_KEY)
        attempts = [
            client.get("/v1/agents/alice", headers=bob),
            client.get("/v1/agents/alice/messages", headers=bob),
            client.patch("/v1/agents/alice", json={"pinned": True}, headers=bob),
            client.post("/v1/agents/alice/generate", json=turn, headers=bob),
            client.post("/v1/agents/alice/fork", json={"agent_id": "mine"}, headers=bob),
            client.post("/v1/agents/alice/persist", headers=bob),
            client.delete("/v1/agents/alice", headers=bob),
            # Naming Alice's owner is an admin's privilege, not a way around the check.
            client.get("/v1/agents/alice", params={"owner": owner_of(ALICE_KEY)}, headers=bob),
        ]
        for response in attempts[:-1]:
            assert error_of(response, 404)["message"] == "no agent 'alice'"
        assert "owner" in error_of(attempts[-1], 404)["message"]
        assert listed(client, BOB_KEY) == []
        # Without admin keys every key reaches /admin/, but sees its own agents there only.
        seen = client.get("/admin/cache", headers=bob).json()["agents"]
        assert seen == [] and "secret plan" not in json.dumps(seen)
        # Naming Alice's agent there finds nothing, as an unknown id does: not even a 404.
        alices = {"agents": ["alice"], "owner": owner_of(ALICE_KEY)}
        for route in ("/admin/cache/persist", "/admin/cache/evict"):
            answer = client.post(route, json=alices, headers=bob)
            assert answer.status_code == 200, answer.text
        assert client.post("/admin/cache/persist", json=alices, headers=bob).json() == {
            "blocks_written": 0,
            "failed": 0,
            "agents_saved": 0,
            "agents_failed": 0,
        }
        assert listed(client, ALICE_KEY) == [("alice", owner_of(ALICE_KEY))]
        messages = client.get("/v1/agents/alice/messages", headers=as_(ALICE_KEY)).json()
        assert len(messages["data"]) == 2 and messages["system"] == "Alice's secret plan."
        # And Bob may have an "alice" of his own.
        assert create(client, BOB_KEY, "alice")["owner"] == owner_of(BOB_KEY)
        assert len(listed(client, ALICE_KEY)) == len(listed(client, BOB_KEY)) == 1


def test_an_admin_key_sees_every_keys_agents_and_reaches_them_by_owner(
    chat_served: ServedModel, tmp_path: Path
) -> None:
    with keyed(chat_served, tmp_path) as (client, engine):
        create(client, ALICE_KEY, "twin", system="Alice's.")
        create(client, BOB_KEY, "twin", system="Bob's.")
        admin = as_(ADMIN_KEY)
        # A page keeps the agents of one id together, past `limit` if need be.
        both = client.get("/v1/agents", params={"limit": 1}, headers=admin).json()
        assert [a["agent_id"] for a in both["data"]] == ["twin", "twin"] and not both["has_more"]
        create(client, BOB_KEY, "zed")
        assert listed(client, ADMIN_KEY) == sorted(
            [("twin", owner_of(ALICE_KEY)), ("twin", owner_of(BOB_KEY)), ("zed", owner_of(BOB_KEY))]
        )
        first = client.get("/v1/agents", params={"limit": 1}, headers=admin).json()
        assert [a["agent_id"] for a in first["data"]] == ["twin", "twin"] and first["has_more"]
        rest = client.get("/v1/agents", params={"after": "twin"}, headers=admin).json()
        assert [a["agent_id"] for a in rest["data"]] == ["zed"] and not rest["has_more"]
        assert listed(client, ADMIN_KEY, owner=owner_of(BOB_KEY)) == [
            ("twin", owner_of(BOB_KEY)),
            ("zed", owner_of(BOB_KEY)),
        ]
        # By default an admin key means its own agents; `owner` names another key's.
        assert error_of(client.get("/v1/agents/twin", headers=admin), 404)
        bobs = client.get(
            "/v1/agents/twin/messages", params={"owner": owner_of(BOB_KEY)}, headers=admin
        )
        assert bobs.json()["system"] == "Bob's."
        gone = client.delete("/v1/agents/twin", params={"owner": owner_of(BOB_KEY)}, headers=admin)
        assert gone.status_code == 200
        assert listed(client, BOB_KEY) == [("zed", owner_of(BOB_KEY))]
        assert [a["owner"] for a in client.get("/admin/cache", headers=admin).json()["agents"]] == [
            owner_of(ALICE_KEY),
            owner_of(BOB_KEY),
        ]
        bad = client.get("/v1/agents/twin", params={"owner": "../x"}, headers=admin)
        assert error_of(bad, 400)["param"] == "owner"
    assert AgentKey("twin", owner_of(ALICE_KEY)) in engine.agents.by_key


@pytest.mark.parametrize("naming", ["session_id", "x-session-id", "metadata.user_id"])
def test_two_keys_naming_one_session_get_two_agents_and_two_caches(
    chat_served: ServedModel, tmp_path: Path, naming: str
) -> None:
    def chat(client: TestClient, key: str, text: str) -> dict[str, Any]:
        messages = [{"role": "user", "content": text}]
        headers = as_(key)
        if naming == "metadata.user_id":
            route, body = (
                "/v1/messages",
                CHAT | {"messages": messages, "metadata": {"user_id": "s1"}},
            )
        else:
            route, body = "/v1/chat/completions", CHAT | {"messages": messages}
            if naming == "session_id":
                body["session_id"] = "s1"
            else:
                headers |= {"x-session-id": "s1"}
        response = client.post(route, json=body, headers=headers)
        assert response.status_code == 200, response.text
        return dict(response.json())

    with keyed(chat_served, tmp_path) as (client, engine):
        chat(client, ALICE_KEY, "The quick brown fox jumps over the lazy dog, says Alice.")
        chat(client, BOB_KEY, "Bob has a different story to tell, about a lazy cat.")
        alice = engine.agents.by_key[AgentKey("s1", owner_of(ALICE_KEY))]
        bob = engine.agents.by_key[AgentKey("s1", owner_of(BOB_KEY))]
        assert alice is not bob and alice.stats.requests == bob.stats.requests == 1
        assert set(alice.hashes).isdisjoint(bob.hashes)
        assert listed(client, ALICE_KEY) == [("s1", owner_of(ALICE_KEY))]
        assert len(listed(client, ADMIN_KEY)) == 2


def test_ownership_outlives_a_restart(chat_served: ServedModel, tmp_path: Path) -> None:
    with keyed(chat_served, tmp_path) as (client, engine):
        create(client, ALICE_KEY, "keeper", system="Mine.")
        root = engine.tiering.disk.model_root
    manifest = load_manifest(root, AgentKey("keeper", owner_of(ALICE_KEY)))
    assert manifest is not None and manifest.owner == owner_of(ALICE_KEY)
    files = list((root / "agents").rglob("*.json"))
    assert len(files) == 1 and ALICE_KEY not in files[0].read_text()  # a digest, never the key
    with keyed(chat_served, tmp_path) as (client, _):
        assert error_of(client.get("/v1/agents/keeper", headers=as_(BOB_KEY)), 404)
        kept = client.get("/v1/agents/keeper/messages", headers=as_(ALICE_KEY))
        assert kept.json()["system"] == "Mine."


def test_without_keys_every_client_is_the_one_owner(
    chat_served: ServedModel, tmp_path: Path
) -> None:
    with running(chat_served, tmp_path) as (client, engine, _):
        assert client.post("/v1/agents", json={"agent_id": "solo"}).json()["owner"] is None
        headers = {"x-session-id": "chat"}
        body = CHAT | {"messages": [{"role": "user", "content": "Hi"}]}
        assert client.post("/v1/chat/completions", json=body, headers=headers).status_code == 200
        listing = client.get("/v1/agents").json()["data"]
        assert [(a["agent_id"], a["owner"]) for a in listing] == [("chat", None), ("solo", None)]
        root = engine.tiering.disk.model_root
    assert [p.name for p in (root / "agents").iterdir()] == [UNOWNED]


def test_agents_made_before_owners_are_the_admins_once_keys_are_set(
    chat_served: ServedModel, tmp_path: Path
) -> None:
    with running(chat_served, tmp_path) as (client, _, _):  # a server without keys
        assert (
            client.post("/v1/agents", json={"agent_id": "old", "system": "Old."}).status_code == 201
        )
    with keyed(chat_served, tmp_path) as (client, _):
        assert listed(client, ALICE_KEY) == []
        assert error_of(client.get("/v1/agents/old", headers=as_(ALICE_KEY)), 404)
        assert listed(client, ADMIN_KEY) == [("old", None)]
        owned_by_none = {"owner": UNOWNED}
        kept = client.get("/v1/agents/old/messages", params=owned_by_none, headers=as_(ADMIN_KEY))
        assert kept.json()["system"] == "Old."
