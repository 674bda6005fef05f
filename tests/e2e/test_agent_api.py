"""The direct agent API end to end, against real `semantic serve` processes on SmolLM2: create,
two turns (the second served from the first's cache), fork, a streamed turn of the child,
delete the parent, the child's next turn, persist, kill -9, restart, and a turn served from
disk."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import Server, started

pytestmark = pytest.mark.e2e

BLOCK = 256  # the default block size
SYSTEM = (
    "You are the build assistant of a small software team. You answer questions about the "
    "project's code, its tests and its release process, in one short sentence. "
) * 9  # about 300 tokens: a full block and a partial one


def call(server: Server, method: str, path: str, status: int = 200, **body: Any) -> Any:
    response = httpx.request(method, f"{server.url}{path}", json=body or None, timeout=300)
    assert response.status_code == status, f"{response.text}\n{server.log()}"
    return response.json()


def turn(server: Server, agent: str, message: str) -> dict[str, Any]:
    reply: dict[str, Any] = call(server, "POST", f"/v1/agents/{agent}/generate", message=message)
    assert reply["text"] and reply["usage"]["completion_tokens"] > 0
    return reply


def streamed_turn(server: Server, agent: str, message: str) -> dict[str, Any]:
    url = f"{server.url}/v1/agents/{agent}/generate"
    with httpx.stream("POST", url, json={"message": message, "stream": True}, timeout=300) as r:
        assert r.status_code == 200
        frames = [f for f in r.read().decode().split("\n\n") if f and not f.startswith(":")]
    events = [(f.split("\n")[0].removeprefix("event: "), f.split("\n")[1][6:]) for f in frames]
    assert [name for name, _ in events[:-1]] == ["delta"] * (len(events) - 1)
    assert events[-1][0] == "done"
    done: dict[str, Any] = json.loads(events[-1][1])
    assert done["text"] == "".join(json.loads(data)["text"] for _, data in events[:-1])
    return done


def reused(reply: dict[str, Any], before: dict[str, Any], from_disk: bool = False) -> bool:
    """At least the previous turn's prompt came from the cache (from disk: its whole blocks)."""
    prompt = before["usage"]["prompt_tokens"]
    least = prompt // BLOCK * BLOCK if from_disk else prompt
    return least <= reply["usage"]["cached_tokens"] < reply["usage"]["prompt_tokens"]


def test_an_agent_lives_through_a_fork_a_delete_a_persist_and_a_crash(tmp_path: Path) -> None:
    server = started(tmp_path, "first")
    try:
        defaults = {"temperature": 0, "max_tokens": 8}
        created = call(
            server, "POST", "/v1/agents", 201, agent_id="lead", system=SYSTEM, defaults=defaults
        )
        assert created["conversation"]["messages"] == 0
        first = turn(server, "lead", "What should I test first?")
        second = turn(server, "lead", "And after that?")
        assert first["usage"]["cached_tokens"] == 0 and reused(second, first)

        forked = call(server, "POST", "/v1/agents/lead/fork", 201, agent_id="scout")
        assert forked["conversation"]["messages"] == 4
        child = streamed_turn(server, "scout", "What about the docs?")
        assert reused(child, second)  # the parent's history, from the parent's blocks

        assert call(server, "DELETE", "/v1/agents/lead")["deleted"] is True
        later = turn(server, "scout", "Anything else?")
        assert reused(later, child)

        persisted = call(server, "POST", "/v1/agents/scout/persist")
        assert persisted["durable"] is True
    finally:
        os.kill(server.process.pid, signal.SIGKILL)  # no graceful shutdown: only the persist
        server.process.wait()

    restarted = started(tmp_path, "second")
    try:
        kept = call(restarted, "GET", "/v1/agents/scout/messages")
        assert len(kept["data"]) == 8 and kept["data"][-1]["content"] == later["text"]
        assert call(restarted, "GET", "/v1/agents/lead", 404)
        again = turn(restarted, "scout", "One more thing?")
        stats = call(restarted, "GET", "/v1/agents/scout")
    finally:
        assert restarted.stop() == 0
    assert reused(again, later, from_disk=True)
    assert stats["disk_hit_tokens"] == again["usage"]["cached_tokens"]
