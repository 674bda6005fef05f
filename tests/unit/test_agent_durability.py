"""What the agent API acknowledges is on disk, over the fake runner: a change whose manifest
cannot be written (or, for a delete, removed) answers 500 `persist_failed` and leaves nothing
changed; ids that differ only
in case have files of their own; a chat request whose agent is deleted while it runs does not
bring the agent back."""

from __future__ import annotations

import asyncio
import errno
from pathlib import Path

import pytest

from semantic.cache.agents import manifest
from semantic.cache.agents.manifest import manifest_path
from semantic.core import AgentKey, Caller, Request, SamplingParams, TokenEvent
from semantic.models.served import ServedModel
from tests.unit.fakes import SteppedRunner, engine_on, running
from tests.unit.test_agent_api import create, error_of, generate, sse_events


def full(path: Path, data: bytes) -> None:
    """`write_durably` on a full disk."""
    raise OSError(errno.ENOSPC, "No space left on device", str(path))


def persist_failed(response: object) -> None:
    error = error_of(response, 500)  # type: ignore[arg-type]
    assert error["code"] == "persist_failed" and "No space left on device" in error["message"]
    assert "/" not in error["message"]  # no path of the server's in what a client reads


def test_a_create_or_fork_whose_manifest_cannot_be_written_leaves_no_agent(
    chat_served: ServedModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with running(chat_served, tmp_path) as (client, _, _):
        create(client, "parent", system="Kept.")

        monkeypatch.setattr(manifest, "write_durably", full)
        persist_failed(client.post("/v1/agents", json={"agent_id": "ghost"}))
        persist_failed(client.post("/v1/agents/parent/fork", json={"agent_id": "child"}))
        for missing in ("ghost", "child"):
            assert error_of(client.get(f"/v1/agents/{missing}"), 404)
        assert [a["agent_id"] for a in client.get("/v1/agents").json()["data"]] == ["parent"]
        monkeypatch.undo()
        assert create(client, "ghost")["agent_id"] == "ghost"  # the id was never taken
    with running(chat_served, tmp_path) as (client, _, _):
        listed = [a["agent_id"] for a in client.get("/v1/agents").json()["data"]]
    assert listed == ["ghost", "parent"]


def test_a_pin_whose_manifest_cannot_be_written_is_undone(
    chat_served: ServedModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with running(chat_served, tmp_path) as (client, engine, _):
        create(client, "anchor")
        generate(client, "anchor", "Hello world!")

        monkeypatch.setattr(manifest, "write_durably", full)
        persist_failed(client.patch("/v1/agents/anchor", json={"pinned": True}))
        assert client.get("/v1/agents/anchor").json()["pinned"] is False
        assert not engine.tiering.protected  # the disk budget may drop its files again


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_turn_whose_manifest_cannot_be_written_leaves_the_conversation_as_it_was(
    chat_served: ServedModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stream: bool
) -> None:
    with running(chat_served, tmp_path) as (client, _, _):
        create(client, "writer", system="Be brief.")
        generate(client, "writer", "First turn.")

        monkeypatch.setattr(manifest, "write_durably", full)
        body = {"message": "Second turn.", "max_tokens": 3, "stream": stream}
        response = client.post("/v1/agents/writer/generate", json=body)
        if stream:
            assert response.status_code == 200
            events = sse_events(response.text)
            assert "done" not in [name for name, _ in events]
            error = events[-1][1]["error"]
            assert events[-1][0] == "error" and error["code"] == "persist_failed"
        else:
            persist_failed(response)
        assert len(client.get("/v1/agents/writer/messages").json()["data"]) == 2
        monkeypatch.undo()
        assert generate(client, "writer", "Second turn, again.")["messages"] == 4  # released
    with running(chat_served, tmp_path) as (client, _, _):
        kept = client.get("/v1/agents/writer/messages").json()["data"]
    assert [m["content"] for m in kept if m["role"] == "user"] == [
        "First turn.",
        "Second turn, again.",
    ]


def test_a_delete_whose_manifest_cannot_be_removed_leaves_the_agent_as_it_was(
    chat_served: ServedModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    unlink = Path.unlink

    def refuse_manifests(path: Path, missing_ok: bool = False) -> None:
        if "agents" in path.parts:  # a folder a server may not write in any more
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        unlink(path, missing_ok)

    with running(chat_served, tmp_path) as (client, engine, _):
        create(client, "stays", system="Kept.")
        generate(client, "stays", "Hello world!")
        assert client.patch("/v1/agents/stays", json={"pinned": True}).status_code == 200
        assert engine.pool.num_held > 0  # its pins (the engine is idle: read from here)

        monkeypatch.setattr(Path, "unlink", refuse_manifests)
        error = error_of(client.delete("/v1/agents/stays"), 500)
        assert error["code"] == "persist_failed" and "Permission denied" in error["message"]
        assert "/" not in error["message"]
        agent = client.get("/v1/agents/stays").json()
        assert agent["pinned"] is True and agent["conversation"]["messages"] == 2
        monkeypatch.undo()
        assert client.delete("/v1/agents/stays").status_code == 200
        # Its pins went with it: none were leaked by the delete that failed.
        assert engine.pool.num_held == 0
        engine.pool.check_integrity()
    with running(chat_served, tmp_path) as (client, _, _):
        assert error_of(client.get("/v1/agents/stays"), 404)


def test_ids_that_differ_only_in_case_have_files_of_their_own(
    chat_served: ServedModel, tmp_path: Path
) -> None:
    with running(chat_served, tmp_path) as (client, engine, _):
        create(client, "Alice", system="Upper.")
        create(client, "alice", system="Lower.")
        root = engine.tiering.disk.model_root
    upper, lower = (manifest_path(root, AgentKey(a)) for a in ("Alice", "alice"))
    # Where the filesystem ignores case (macOS), these are still two files.
    assert upper.name.lower() != lower.name.lower() and upper.is_file() and lower.is_file()
    with running(chat_served, tmp_path) as (client, _, _):
        systems = {
            agent_id: client.get(f"/v1/agents/{agent_id}/messages").json()["system"]
            for agent_id in ("Alice", "alice")
        }
    assert systems == {"Alice": "Upper.", "alice": "Lower."}


def test_a_chat_request_whose_agent_is_deleted_while_it_runs_does_not_bring_it_back(
    chat_served: ServedModel, tmp_path: Path
) -> None:
    runner = SteppedRunner(num_blocks=32, block_tokens=8, vocab_size=400, first_token_id=3)
    engine = engine_on(runner, chat_served, tmp_path)
    request = Request("late", list(range(10, 30)), SamplingParams(max_tokens=8), agent_id="late")

    async def scenario() -> None:
        async def run() -> list[TokenEvent]:
            return [event async for event in engine.stream(request)]

        events = asyncio.ensure_future(run())
        runner.allow(1)
        await asyncio.to_thread(runner.wait_for_a_step)  # it runs: its agent exists
        # The engine thread waits in its next step; the delete is taken at the one after.
        deleted = asyncio.ensure_future(engine.agent_door.delete(Caller(None, admin=True), "late"))
        await asyncio.sleep(0)  # the delete is queued before the step that takes it is allowed
        runner.allow(1)
        await deleted  # NotFound, had the agent not been there
        runner.release()
        final = (await events)[-1]
        assert final.error is None and final.usage is not None
        assert final.usage.completion_tokens == 8  # it ran to its end after the delete
        assert await engine.call(lambda: AgentKey("late") not in engine.agents.by_key)

    engine.start()
    try:
        asyncio.run(scenario())
    finally:
        engine.stop()  # persists every agent: the deleted one has none to write
    assert not manifest_path(engine.tiering.disk.model_root, AgentKey("late")).exists()
