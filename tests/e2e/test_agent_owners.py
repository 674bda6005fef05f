"""Agents belong to the key that made them, against real `semantic serve` processes on SmolLM2
with two keys and an admin key: another key neither lists nor reads an agent, two keys naming
one session through the SDKs get two agents, an admin key sees them all, and all of it holds
after a restart."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from tests.e2e.conftest import Server, started

pytestmark = pytest.mark.e2e

ALICE, BOB, ADMIN = "sk-e2e-alice-41f0", "sk-e2e-bob-7a2c", "sk-e2e-admin-9d3e"


def owner(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()[:32]


def keyed(folder: Path, name: str) -> Server:
    return started(folder, name, "--api-key", f"{ALICE},{BOB}", "--admin-api-key", ADMIN)


def call(server: Server, key: str, method: str, path: str, **body: Any) -> httpx.Response:
    headers = {"authorization": f"Bearer {key}"}
    return httpx.request(
        method, f"{server.url}{path}", json=body or None, headers=headers, timeout=300
    )


def listed(server: Server, key: str) -> list[tuple[str, str | None]]:
    response = call(server, key, "GET", "/v1/agents")
    assert response.status_code == 200, response.text
    return [(a["agent_id"], a["owner"]) for a in response.json()["data"]]


def chat_in_session(server: Server, key: str, text: str) -> None:
    """One turn in session `shared`, through each SDK as a client would send it."""
    openai.OpenAI(base_url=f"{server.url}/v1", api_key=key).chat.completions.create(
        model="smollm2-135m",
        max_tokens=4,
        messages=[{"role": "user", "content": text}],
        extra_body={"session_id": "shared"},
    )
    anthropic.Anthropic(base_url=server.url, api_key=key).messages.create(
        model="smollm2-135m",
        max_tokens=4,
        messages=[{"role": "user", "content": text}],
        metadata={"user_id": "shared"},
    )


def test_another_key_never_sees_an_agent_and_two_keys_sessions_are_two_agents(
    tmp_path: Path,
) -> None:
    server = keyed(tmp_path, "first")
    try:
        made = call(server, ALICE, "POST", "/v1/agents", agent_id="alice", system="Alice only.")
        assert made.status_code == 201 and made.json()["owner"] == owner(ALICE)
        turn = call(server, ALICE, "POST", "/v1/agents/alice/generate", message="Hi", max_tokens=4)
        assert turn.status_code == 200, turn.text
        chat_in_session(server, ALICE, "Alice asks about the weather in Paris today.")
        chat_in_session(server, BOB, "Bob asks how to bake bread at home.")
        for path in ("/v1/agents/alice", "/v1/agents/alice/messages"):
            assert call(server, BOB, "GET", path).status_code == 404
        assert call(server, BOB, "DELETE", "/v1/agents/alice").status_code == 404
        assert listed(server, BOB) == [("shared", owner(BOB))]
        everyone = [
            ("alice", owner(ALICE)),
            *sorted([("shared", owner(ALICE)), ("shared", owner(BOB))]),
        ]
        assert listed(server, ADMIN) == everyone
        bobs = call(server, ADMIN, "GET", f"/v1/agents/shared?owner={owner(BOB)}").json()
        assert bobs["requests"] == 2 and bobs["owner"] == owner(BOB)
    finally:
        assert server.stop() == 0  # persists every agent, manifests with their owners
    restarted = keyed(tmp_path, "second")
    try:
        assert call(restarted, BOB, "GET", "/v1/agents/alice").status_code == 404
        kept = call(restarted, ALICE, "GET", "/v1/agents/alice/messages").json()
        assert kept["system"] == "Alice only." and len(kept["data"]) == 2
        assert listed(restarted, ADMIN) == everyone
    finally:
        restarted.stop()
    files = list((tmp_path / "cache" / "kv").glob("*/agents/*/*.json"))
    assert {f.parent.name for f in files} == {owner(ALICE), owner(BOB)}
    assert not any(key in f.read_text() for f in files for key in (ALICE, BOB, ADMIN))
