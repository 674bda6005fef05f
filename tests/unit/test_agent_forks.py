"""Forks share their parent's conversation, over the fake runner: one file on disk and one value
in memory for ninety forks of an 8 MB system prompt, at start-up too; the agent list carries
summaries, never conversations; each key's conversation text is bounded
(`max_conversations_mb_per_key`, 413); and a shared conversation outlives whichever agent goes
first and goes with the last."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from semantic.cache.agents.conversation import Conversation
from semantic.cache.agents.conversation_files import ConversationFiles, conversation_path
from semantic.cache.agents.manifest import (
    AgentManifest,
    ManifestFiles,
    manifest_path,
    save_manifest,
)
from semantic.core import AgentKey
from semantic.engine.engine import Engine
from semantic.models.served import ServedModel
from tests.unit.fakes import running
from tests.unit.test_agent_api import create, error_of, generate

pytestmark = pytest.mark.usefixtures("no_outside_settings")

SYSTEM_BYTES = 8_000_000
FORKS = 90


def fork(client: TestClient, parent: str, child: str) -> None:
    response = client.post(f"/v1/agents/{parent}/fork", json={"agent_id": child})
    assert response.status_code == 201, response.text


def big_family(client: TestClient) -> None:
    """An agent with an 8 MB system prompt, forked ninety times (no turn: the system prompt is
    past the fake model's context)."""
    create(client, "parent", system="x" * SYSTEM_BYTES)
    for i in range(FORKS):
        fork(client, "parent", f"fork-{i}")


def stored_bytes(engine: Engine) -> tuple[int, int]:
    """(conversation files, bytes of the manifests and conversation files together)."""
    root = engine.tiering.disk.model_root
    conversations = list((root / "conversations").glob("*.json"))
    manifests = list((root / "agents").rglob("*.json"))
    return len(conversations), sum(p.stat().st_size for p in [*conversations, *manifests])


def conversations_held(engine: Engine) -> set[int]:
    return {id(agent.conversation) for agent in engine.agents.by_key.values()}


def test_ninety_forks_of_an_8_mb_agent_keep_one_copy_on_disk_and_in_memory(
    chat_served: ServedModel, tmp_path: Path
) -> None:
    with running(chat_served, tmp_path) as (client, engine, _):
        big_family(client)
        files, total = stored_bytes(engine)
        assert files == 1 and total < SYSTEM_BYTES * 1.05  # 91 copies were 728 MB
        assert len(conversations_held(engine)) == 1  # one value, not 91


def test_a_restart_loads_forks_as_one_conversation(
    chat_served: ServedModel, tmp_path: Path
) -> None:
    with running(chat_served, tmp_path) as (client, _, _):
        big_family(client)
    with running(chat_served, tmp_path) as (client, engine, _):
        assert len(engine.agents.by_key) == FORKS + 1
        assert len(conversations_held(engine)) == 1
        assert stored_bytes(engine)[0] == 1
        messages = client.get("/v1/agents/fork-7/messages").json()
        assert len(messages["system"]) == SYSTEM_BYTES and messages["data"] == []


def test_the_agent_list_stays_small_however_large_the_conversations(
    chat_served: ServedModel, tmp_path: Path
) -> None:
    with running(chat_served, tmp_path) as (client, _, _):
        big_family(client)
        listed = client.get("/v1/agents", params={"limit": 1000})
        described = client.get("/v1/agents/fork-3")
    assert listed.status_code == 200 and len(listed.json()["data"]) == FORKS + 1
    assert len(listed.content) < (FORKS + 1) * 1024  # it was 764 MB
    assert len(described.content) < 1024
    summary = described.json()["conversation"]
    assert summary == {"defaults": {}, "messages": 0, "text_bytes": SYSTEM_BYTES}


def test_past_the_keys_quota_a_create_or_a_turn_is_a_413_and_forks_count_once(
    chat_served: ServedModel, tmp_path: Path
) -> None:
    half = 2**20 // 2 + 1  # two of them are past 1 MiB
    with running(chat_served, tmp_path, max_conversations_mb_per_key=1) as (client, _, _):
        create(client, "parent", system="x" * half)
        for i in range(5):  # five forks hold the parent's conversation: nothing more
            fork(client, "parent", f"fork-{i}")
        second = client.post("/v1/agents", json={"agent_id": "other", "system": "y" * half})
        refused = error_of(second, 413)
        assert refused["code"] == "conversation_quota_exceeded"
        assert "max_conversations_mb_per_key" in refused["message"]
        create(client, "small", system="y" * (half // 2))
        turn = client.post("/v1/agents/small/generate", json={"message": "z" * (half // 2)})
        assert error_of(turn, 413)["code"] == "conversation_quota_exceeded"
        assert client.get("/v1/agents/small/messages").json()["data"] == []  # as it was
        for agent_id in ["parent", *(f"fork-{i}" for i in range(5))]:
            assert client.delete(f"/v1/agents/{agent_id}").status_code == 200
        create(client, "other", system="y" * half)  # the room came back


def test_deleting_the_parent_keeps_the_forks_conversation_and_the_last_user_frees_it(
    chat_served: ServedModel, tmp_path: Path
) -> None:
    with running(chat_served, tmp_path) as (client, engine, _):
        create(client, "parent", system="Be brief.")
        first = generate(client, "parent", "Hello world!")
        fork(client, "parent", "child")
        assert client.delete("/v1/agents/parent").status_code == 200
        kept = client.get("/v1/agents/child/messages").json()
        assert kept["system"] == "Be brief." and kept["data"][1]["content"] == first["text"]
        assert stored_bytes(engine)[0] == 1
    with running(chat_served, tmp_path) as (client, engine, _):  # and after a restart
        assert client.get("/v1/agents/child/messages").json() == kept
        generate(client, "child", "And again.")  # its own turn: a file of its own
        assert stored_bytes(engine)[0] == 1  # the shared one went with its last user
        assert client.delete("/v1/agents/child").status_code == 200
        assert stored_bytes(engine)[0] == 0


def test_a_conversation_file_goes_only_when_no_manifest_names_it(tmp_path: Path) -> None:
    root = tmp_path / "model"
    files = ConversationFiles(root)
    shared = Conversation("shared")
    digest = files.retain(shared)
    assert files.retain(Conversation("shared")) == digest  # equal values share one file
    files.release(digest)
    assert conversation_path(root, digest).is_file()
    files.release(digest)
    assert not conversation_path(root, digest).exists()


def test_at_start_up_an_unnamed_conversation_file_is_removed_and_a_missing_one_quarantines(
    tmp_path: Path,
) -> None:
    root = tmp_path / "model"
    named = Conversation("named")
    save_manifest(root, AgentManifest("keeper", root.name, [], None, 0, conversation=named))
    save_manifest(root, AgentManifest("orphan", root.name, [], None, 0, conversation=None))
    stray = Conversation("stray")
    ConversationFiles(root).retain(stray)  # written, and no manifest names it
    lost = Conversation("lost")
    save_manifest(root, AgentManifest("loser", root.name, [], None, 0, conversation=lost))
    conversation_path(root, lost.digest()).unlink()
    loaded = {m.agent_id: m for m in ManifestFiles(root).load_all()}
    assert set(loaded) == {"keeper", "orphan"}
    assert loaded["keeper"].conversation == named
    assert not conversation_path(root, stray.digest()).exists()
    assert any(p.name.startswith("loser") for p in (root / "quarantine").iterdir())


def test_an_older_manifest_with_its_conversation_inline_is_read_and_rewritten(
    tmp_path: Path,
) -> None:
    root = tmp_path / "model"
    inline = Conversation("inline")
    (root / "agents" / "none").mkdir(parents=True)
    key = AgentKey("elder")
    manifest_path(root, key).write_text(
        '{"format_version": 3, "agent_id": "elder", "owner": null, "model_tag": "model", '
        '"block_hashes": [], "tail_hash": null, "num_tokens": 0, "pinned": false, '
        '"conversation": {"system": "inline", "defaults": {}, "messages": []}, '
        '"updated_at": 1.0}'
    )
    [loaded] = ManifestFiles(root).load_all()
    assert loaded.conversation == inline
    assert conversation_path(root, inline.digest()).is_file()
    assert '"conversation": "' in manifest_path(root, key).read_text()
