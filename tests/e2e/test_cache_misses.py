"""Why a prompt missed, end to end: a real server on SmolLM2 and the Anthropic SDK, as Claude
Code's sessions miss: a timestamp in the system prompt that changed, then a tool added. Each
response's `x-semantic-cache-miss` header names the position and the reason, and
`/admin/cache` lists the misses with the agent's id."""

from __future__ import annotations

import uuid
from typing import Any

import anthropic
import httpx
import pytest

from tests.e2e.conftest import Server

pytestmark = pytest.mark.e2e

HEADER = "x-semantic-cache-miss"
READ = {
    "name": "read_file",
    "description": "Read a file of the project.",
    "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}},
}
WRITE = READ | {"name": "write_file", "description": "Write a file of the project."}


def test_a_changed_timestamp_and_an_added_tool_are_named_with_position_and_reason(
    server: Server,
) -> None:
    sdk = anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0)
    session = f"coder-{uuid.uuid4().hex[:8]}"

    def ask(now: str, tools: list[dict[str, Any]]) -> tuple[Any, Any]:
        raw = sdk.messages.with_raw_response.create(
            model="claude-sonnet-4-6",
            max_tokens=8,
            system=f"You are {session}, a coding agent in a git repository. Current time: {now}.",
            tools=tools,  # type: ignore[arg-type]
            messages=[{"role": "user", "content": "Which files are in the repository?"}],
            extra_headers={"x-session-id": session},
            extra_body={"temperature": 0},
        )
        return raw.headers, raw.parse()

    cold, first = ask("2026-11-28 14:52:07", [READ])
    # The server is shared: another test's request may have cached the template's first tokens.
    found = first.usage.cache_read_input_tokens
    assert cold[HEADER] == f"position={found}; reason=never_seen"
    expected = [(found, "never_seen")]
    for now, tools in [("2026-11-28 14:53:41", [READ]), ("2026-11-28 14:53:41", [READ, WRITE])]:
        headers, answer = ask(now, tools)
        position = answer.usage.cache_read_input_tokens  # read up to where the prompt parted
        assert position > 0 and headers[HEADER] == f"position={position}; reason=prompt_changed"
        expected.append((position, "prompt_changed"))
    misses = httpx.get(f"{server.url}/admin/cache", timeout=30).json()["recent_misses"]
    assert [(m["position"], m["reason"]) for m in misses if m["agent_id"] == session] == expected
