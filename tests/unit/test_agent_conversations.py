"""The agent store under the direct agent API: conversations in manifests, forks counted as
sharers, turns held one at a time, and manifest writes that race a delete."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from semantic.cache.conversation import Conversation, Message, SamplingDefaults
from semantic.cache.manifest import AgentManifest, load_manifest, save_manifest
from semantic.core import Request, SamplingParams, TokenEvent
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
    assert load_manifest(root, "talker") == manifest
    restarted, _ = make_engine(served, tmp_path)
    assert restarted.agents.by_id["talker"].conversation == TALK


def test_a_version_1_manifest_is_an_agent_without_a_conversation(
    served: ServedModel, tmp_path: Path
) -> None:
    engine, _ = make_engine(served, tmp_path)
    root = engine.tiering.disk.model_root
    save_manifest(root, AgentManifest("old", root.name, [1], None, 8))
    path = root / "agents" / "old.json"
    raw = json.loads(path.read_text())
    del raw["conversation"]
    path.write_text(json.dumps(raw | {"format_version": 1}))
    loaded = load_manifest(root, "old")
    assert loaded is not None and loaded.conversation is None and loaded.block_hashes == [1]


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
    path = root / "agents" / "bad.json"
    path.write_text(json.dumps(json.loads(path.read_text()) | {"conversation": conversation}))
    assert load_manifest(root, "bad") is None
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
    store.create("parent", TALK)
    run_turn(engine, "parent", list(range(10, 30)))  # two full blocks and a tail
    parent = store.by_id["parent"]
    child = store.fork("parent", "child")
    assert child.conversation == TALK and child.hashes == parent.hashes
    assert all(store._sharers[h] == 2 for h in parent.hashes)
    with pytest.raises(Conflict):
        store.fork("parent", "child")
    with pytest.raises(NotFound):
        store.fork("nobody", "other")
    assert store.delete("parent")
    assert all(store._sharers[h] == 1 for h in child.hashes)
    assert all(engine.pool.lookup(h) is not None for h in child.hashes)
    engine.pool.check_integrity()
    engine.prefix.check_integrity()


def test_turns_are_held_one_at_a_time_and_released_only_by_their_own_id(
    served: ServedModel, tmp_path: Path
) -> None:
    engine, _ = make_engine(served, tmp_path)
    store = engine.agents
    store.create("alice", TALK)
    assert store.begin_turn("alice", "t1") == TALK
    with pytest.raises(Conflict):
        store.begin_turn("alice", "t2")
    with pytest.raises(Conflict):
        store.delete("alice")
    assert store.end_turn("alice", "t2") is None  # not its hold
    longer = TALK.with_turn("And?", "Done.")
    assert store.end_turn("alice", "t1", longer) is store.by_id["alice"]
    assert store.end_turn("alice", "t1") is None  # released already
    assert store.by_id["alice"].conversation == longer
    with pytest.raises(NotFound):
        store.begin_turn("nobody", "t3")


def test_a_manifest_write_after_a_delete_does_not_bring_the_agent_back(
    served: ServedModel, tmp_path: Path
) -> None:
    engine, _ = make_engine(served, tmp_path)
    store = engine.agents
    stale = store.create("ghost", TALK)
    assert store.save_manifest(stale)
    assert store.delete("ghost")
    assert not store.save_manifest(stale)  # a late write of the deleted agent
    assert load_manifest(store.model_root, "ghost") is None
    again = store.create("ghost", Conversation("Second life."))
    assert not store.save_manifest(stale) and store.save_manifest(again)
    loaded = load_manifest(store.model_root, "ghost")
    assert loaded is not None and loaded.conversation == Conversation("Second life.")
