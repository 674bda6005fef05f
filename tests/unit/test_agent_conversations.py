"""The agent store under the direct agent API: conversations in manifests, forks counted as
sharers, turns held one at a time, and manifest writes that race a delete."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from semantic.cache.agents.conversation import Conversation, Message, SamplingDefaults
from semantic.cache.agents.manifest import (
    MANIFEST_FORMAT_VERSION,
    AgentManifest,
    load_manifest,
    manifest_path,
    save_manifest,
)
from semantic.core import AgentKey, Request, SamplingParams, TokenEvent
from semantic.engine.engine import Engine
from semantic.errors import Conflict, NotFound
from semantic.models.served import ServedModel
from tests.unit.fakes import make_engine

TALK = Conversation(
    "Be brief.",
    SamplingDefaults(temperature=0.0, max_tokens=12, stop=("\n\n",)),
    (Message("user", "Hi"), Message("assistant", "Hello! 日本語 😀")),
)


def run_turn(engine: Engine, agent_id: str, prompt: list[int]) -> None:
    """One request of the agent through the engine, without its thread."""
    sampling = SamplingParams(temperature=0.0, max_tokens=4)
    request = Request(f"{agent_id}-{len(prompt)}", prompt, sampling, agent_id=agent_id)
    events: list[TokenEvent] = []
    engine.submit(request, events.append)
    engine.run_until_idle()
    assert events[-1].error is None


def test_a_manifest_keeps_the_conversation(served: ServedModel, tmp_path: Path) -> None:
    engine, _ = make_engine(served, tmp_path)
    root = engine.tiering.disk.model_root
    manifest = AgentManifest("talker", root.name, [1, 2], 3, 20, conversation=TALK)
    save_manifest(root, manifest)
    assert load_manifest(root, AgentKey("talker")) == manifest
    restarted, _ = make_engine(served, tmp_path)
    assert restarted.agents.by_key[AgentKey("talker")].conversation == TALK


def test_a_version_1_manifest_is_an_unowned_agent_without_a_conversation_under_its_new_name(
    served: ServedModel, tmp_path: Path
) -> None:
    engine, _ = make_engine(served, tmp_path)
    root = engine.tiering.disk.model_root
    legacy = root / "agents" / "old.json"  # where versions 1 and 2 kept it
    version_1 = {
        "format_version": 1,
        "agent_id": "old",
        "model_tag": root.name,
        "block_hashes": ["0000000000000001"],
        "tail_hash": None,
        "num_tokens": 8,
        "pinned": False,
        "updated_at": 1.0,
    }
    legacy.write_text(json.dumps(version_1))
    restarted, _ = make_engine(served, tmp_path)
    agent = restarted.agents.by_key[AgentKey("old")]
    assert agent.owner is None and agent.conversation is None and agent.block_hashes == [1]
    assert not legacy.exists()
    loaded = load_manifest(root, AgentKey("old"))
    assert loaded is not None and loaded.format_version == MANIFEST_FORMAT_VERSION
    assert loaded.block_hashes == [1] and loaded.owner is None
    # A crash between writing the new file and removing the old: the new one wins.
    legacy.write_text(json.dumps(version_1 | {"num_tokens": 99}))
    again, _ = make_engine(served, tmp_path)
    assert again.agents.by_key[AgentKey("old")].num_tokens == 8 and not legacy.exists()


@pytest.mark.parametrize(
    "conversation",
    [
        {"system": 3, "defaults": {}, "messages": []},
        {"system": None, "defaults": {"temperature": "hot"}, "messages": []},
        {"system": None, "defaults": {"unknown": 1}, "messages": []},
        {"system": None, "defaults": {}, "messages": [{"role": "system", "content": "x"}]},
        {"system": None, "defaults": {}, "messages": [{"role": "user"}]},
        {"system": None, "messages": []},
    ],
)
def test_a_manifest_with_a_bad_conversation_is_quarantined(
    served: ServedModel, tmp_path: Path, conversation: object
) -> None:
    engine, _ = make_engine(served, tmp_path)
    root = engine.tiering.disk.model_root
    save_manifest(root, AgentManifest("bad", root.name, [], None, 0, conversation=TALK))
    path = manifest_path(root, AgentKey("bad"))
    path.write_text(json.dumps(json.loads(path.read_text()) | {"conversation": conversation}))
    assert load_manifest(root, AgentKey("bad")) is None
    assert [p.name.split(".")[0] for p in (root / "quarantine").iterdir()] == ["bad"]


def test_a_call_overrides_only_what_it_sets() -> None:
    agent = SamplingDefaults(temperature=0.2, top_p=0.5, max_tokens=12)
    call = SamplingDefaults(top_p=0.9, stop=("!",))
    assert agent.overridden_by(call) == SamplingDefaults(0.2, 0.9, None, 12, ("!",), None)
    assert SamplingDefaults.from_json(agent.to_json()) == agent


def test_a_fork_is_one_more_sharer_of_each_block_and_delete_keeps_the_others(
    served: ServedModel, tmp_path: Path
) -> None:
    engine, _ = make_engine(served, tmp_path)
    store = engine.agents
    store.create(AgentKey("parent"), TALK)
    run_turn(engine, "parent", list(range(10, 30)))  # two full blocks and a tail
    parent = store.by_key[AgentKey("parent")]
    child = store.fork(AgentKey("parent"), AgentKey("child"))
    assert child.conversation == TALK and child.hashes == parent.hashes
    assert all(store.registry.sharers(h) == 2 for h in parent.hashes)
    with pytest.raises(Conflict):
        store.fork(AgentKey("parent"), AgentKey("child"))
    with pytest.raises(NotFound):
        store.fork(AgentKey("nobody"), AgentKey("other"))
    assert store.delete(AgentKey("parent"))
    assert all(store.registry.sharers(h) == 1 for h in child.hashes)
    assert all(engine.pool.lookup(h) is not None for h in child.hashes)
    engine.pool.check_integrity()
    engine.prefix.check_integrity()


def test_turns_are_held_one_at_a_time_and_released_only_by_their_own_id(
    served: ServedModel, tmp_path: Path
) -> None:
    engine, _ = make_engine(served, tmp_path)
    store = engine.agents
    alice = AgentKey("alice")
    store.create(alice, TALK)
    assert store.begin_turn(alice, "t1", "Hi")[1] == TALK
    with pytest.raises(Conflict):
        store.begin_turn(alice, "t2", "Hi")
    with pytest.raises(Conflict):
        store.delete(alice)
    assert not store.end_turn(alice, "t2")  # not its hold
    assert store.end_turn(alice, "t1")
    assert not store.end_turn(alice, "t1")  # released already
    assert store.begin_turn(alice, "t3", "Hi")[1] == TALK  # the conversation unchanged
    with pytest.raises(NotFound):
        store.begin_turn(AgentKey("nobody"), "t4", "Hi")


def test_a_manifest_write_after_a_delete_does_not_bring_the_agent_back(
    served: ServedModel, tmp_path: Path
) -> None:
    engine, _ = make_engine(served, tmp_path)
    store = engine.agents
    stale = store.create(AgentKey("ghost"), TALK)
    assert store.save_manifest(stale)
    assert store.delete(AgentKey("ghost"))
    assert not store.save_manifest(stale)  # a late write of the deleted agent
    assert load_manifest(store.model_root, AgentKey("ghost")) is None
    again = store.create(AgentKey("ghost"), Conversation("Second life."))
    assert not store.save_manifest(stale) and store.save_manifest(again)
    loaded = load_manifest(store.model_root, AgentKey("ghost"))
    assert loaded is not None and loaded.conversation == Conversation("Second life.")


def test_a_manifest_an_older_server_wrote_with_a_lone_surrogate_loads_mended(
    served: ServedModel, tmp_path: Path
) -> None:
    # Servers before the request bodies were mended stored a client's lone surrogate as is; such
    # an agent broke every listing of agents (its text cannot be encoded).
    engine, _ = make_engine(served, tmp_path)
    root = engine.tiering.disk.model_root
    save_manifest(root, AgentManifest("old", root.name, [], None, 0, conversation=TALK))
    path = manifest_path(root, AgentKey("old"))
    raw = json.loads(path.read_text())
    inline = TALK.to_json() | {"system": "half an emoji: \ud83d"}
    raw |= {"format_version": 3, "conversation": inline}  # they kept it in the manifest
    path.write_text(json.dumps(raw))  # escaped as \\ud83d, as json.dumps writes it
    loaded = load_manifest(root, AgentKey("old"))
    assert loaded is not None and loaded.conversation is not None
    assert loaded.conversation.system == "half an emoji: \ufffd"
