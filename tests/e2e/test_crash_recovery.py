"""Turns that survive a crash, against real `semantic serve` processes on SmolLM2: a named
agent's turn (the agent API's, and an Anthropic client's named by `metadata.user_id`) is written
to disk behind its answer, so after kill -9 and a restart on the same cache folder the next turn
reads at least 90% of its history from disk instead of computing it again."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import Server, started

pytestmark = pytest.mark.e2e

SYSTEM = (
    "You are the build assistant of a small software team. You answer questions about the "
    "project's code, its tests and its release process, in one short sentence. "
) * 18  # about 600 tokens: two full 256-token blocks and a partial one
# The Anthropic client's own: the two agents share no block, so neither's turn after the restart
# computes what the other then reads.
CODER_SYSTEM = (
    "You are a coding agent in a terminal. You read files, run the tests and fix what fails, "
    "and you say what you changed in one short sentence. "
) * 18
ANTHROPIC = {"anthropic-version": "2023-06-01"}
DEFAULTS = {"temperature": 0, "max_tokens": 12}


def call(server: Server, method: str, path: str, status: int = 200, **body: Any) -> Any:
    response = httpx.request(
        method, f"{server.url}{path}", json=body or None, headers=ANTHROPIC, timeout=300
    )
    assert response.status_code == status, f"{response.text}\n{server.log()}"
    return response.json()


def message(server: Server, messages: list[dict[str, str]]) -> dict[str, Any]:
    """An Anthropic Messages turn of the agent `coder`, as Claude Code names its session."""
    body: dict[str, Any] = {"model": "claude-sonnet-4-5", "system": CODER_SYSTEM, **DEFAULTS}
    reply: dict[str, Any] = call(
        server, "POST", "/v1/messages", messages=messages, metadata={"user_id": "coder"}, **body
    )
    return reply


def wait_until_on_disk(server: Server, agent: str, timeout_s: float = 60) -> float:
    """Seconds until every block of the agent's history has its file on disk (written behind
    its turn, with no persist asked for)."""
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        stats = call(server, "GET", f"/v1/agents/{agent}")
        if stats["cached_tokens"] and stats["bytes_on_disk"] >= stats["bytes_full_attention"]:
            return time.monotonic() - start
        time.sleep(0.05)
    raise AssertionError(f"agent {agent}'s turn never reached the disk:\n{server.log()}")


def test_after_kill_9_a_named_agents_next_turn_reads_its_history_from_disk(
    tmp_path: Path,
) -> None:
    server = started(tmp_path, "before")
    try:
        call(server, "POST", "/v1/agents", 201, agent_id="lead", system=SYSTEM, defaults=DEFAULTS)
        first = call(server, "POST", "/v1/agents/lead/generate", message="What do I test first?")
        question = [{"role": "user", "content": "What do I test first?"}]
        opening = message(server, question)
        # nothing of the other agent's but the chat template's first few tokens
        assert opening["usage"]["cache_read_input_tokens"] < 16
        for agent in ("lead", "coder"):
            wait_until_on_disk(server, agent)
    finally:
        os.kill(server.process.pid, signal.SIGKILL)  # no shutdown, no persist
        server.process.wait()

    restarted = started(tmp_path, "after")
    try:
        assert call(restarted, "GET", "/v1/agents/coder")["cached_tokens"]  # its manifest came too
        again = call(restarted, "POST", "/v1/agents/lead/generate", message="And after that?")
        answer = "".join(block["text"] for block in opening["content"] if block["type"] == "text")
        follow_up = [
            *question,
            {"role": "assistant", "content": answer},
            {"role": "user", "content": "And after that?"},
        ]
        resumed = message(restarted, follow_up)
    finally:
        assert restarted.stop() == 0

    usage = first["usage"]
    history = usage["prompt_tokens"] + usage["completion_tokens"] - 1  # its last uncomputed
    assert again["usage"]["cached_tokens"] >= 0.9 * history, (again["usage"], history)
    usage = opening["usage"]
    history = usage["input_tokens"] + usage["cache_read_input_tokens"] + usage["output_tokens"] - 1
    cached = resumed["usage"]["cache_read_input_tokens"]
    assert cached >= 0.9 * history, (resumed["usage"], history)
