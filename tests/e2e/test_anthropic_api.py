"""The Anthropic Messages API end to end: a real server on SmolLM2 and the official SDK, as the
Anthropic SDK and Claude Code use it. Answers are kept short: this runs on small CPUs in CI."""

from __future__ import annotations

import json
import secrets
import uuid
from typing import Any

import anthropic
import httpx
import pytest

from tests.e2e.conftest import Server

pytestmark = pytest.mark.e2e

# Any name works: a name the server does not know is served by the loaded model.
MODEL = "claude-sonnet-4-6"
# Recent SDKs take sampling settings only through `extra_body`; the server reads them.
GREEDY = {"extra_body": {"temperature": 0}}
PARIS: dict[str, Any] = {
    "model": MODEL,
    "max_tokens": 16,
    "messages": [{"role": "user", "content": "What is the capital of France?"}],
    **GREEDY,
}


def client(server: Server, **auth: Any) -> anthropic.Anthropic:
    """The SDK as a client sets it up: the base URL without /v1, a key or a bearer token."""
    return anthropic.Anthropic(base_url=server.url, max_retries=0, **(auth or {"api_key": "x"}))


def text_of(message: Any) -> str:
    return "".join(block.text for block in message.content if block.type == "text")


def test_create_answers_with_a_message_and_its_usage(server: Server) -> None:
    answer = client(server).messages.create(**PARIS)
    assert answer.id.startswith("msg_") and answer.model == MODEL and answer.role == "assistant"
    assert "Paris" in text_of(answer)
    assert answer.stop_reason in ("end_turn", "max_tokens") and answer.stop_sequence is None
    usage = answer.usage
    assert usage.output_tokens > 0 and usage.cache_creation_input_tokens == 0
    assert usage.input_tokens + (usage.cache_read_input_tokens or 0) > 0


def test_the_sdk_stream_accumulates_to_the_same_message_as_create(server: Server) -> None:
    sdk = client(server, auth_token="local-token")
    whole = sdk.messages.create(**PARIS)
    with sdk.messages.stream(**PARIS) as stream:
        deltas = list(stream.text_stream)
        final = stream.get_final_message()
    assert "".join(deltas) == text_of(final) == text_of(whole)
    assert [block.type for block in final.content] == ["text"]
    assert final.stop_reason == whole.stop_reason
    assert final.usage.output_tokens == whole.usage.output_tokens
    # The same prompt again: all but its last token comes from the cache.
    assert final.usage.cache_read_input_tokens == (
        whole.usage.input_tokens + (whole.usage.cache_read_input_tokens or 0) - 1
    )


def test_count_tokens_equals_the_prompt_tokens_the_server_prefills(server: Server) -> None:
    sdk = client(server)
    fresh = f"Spell the word {secrets.token_hex(4)} backwards."  # nothing cached past the system
    body: dict[str, Any] = {
        "model": MODEL,
        "system": [{"type": "text", "text": "You answer in one word."}],
        "messages": [{"role": "user", "content": fresh}],
    }
    counted = sdk.messages.count_tokens(**body).input_tokens
    usage = sdk.messages.create(**body, max_tokens=1).usage
    assert counted == usage.input_tokens + (usage.cache_read_input_tokens or 0)
    assert usage.input_tokens > 0  # the new question was prefilled, not found


def test_errors_reach_the_sdk_as_its_exception_classes(server: Server) -> None:
    sdk = client(server)
    with pytest.raises(anthropic.BadRequestError) as bad:
        sdk.messages.create(model=MODEL, max_tokens=-1, messages=[])
    assert bad.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    too_long = [{"role": "user", "content": "Paris is lovely. " * 3000}]
    with pytest.raises(anthropic.BadRequestError) as overflow:
        sdk.messages.create(model=MODEL, max_tokens=8, messages=too_long)  # type: ignore[arg-type]
    assert "prompt is too long" in overflow.value.message


# What Claude Code sends: a billing line whose hash changes every request,
# then its identity and a long prompt, 20+ tools, thinking, a session in metadata.
BETAS = [
    "claude-code-20250219",
    "interleaved-thinking-2025-05-14",
    "context-management-2025-06-27",
    "advisor-tool-2026-03-01",
]
RULES = "\n".join(
    f"- Rule {i}: read the file before editing it, keep changes small, and explain each step."
    for i in range(80)
)


def claude_code_body(history: list[dict[str, Any]], session: str) -> dict[str, Any]:
    billing = (
        "x-anthropic-billing-header: cc_version=2.1.37.0d9; cc_entrypoint=cli; "
        f"cch={secrets.token_hex(3)};"
    )
    tools = [
        {
            "name": f"mcp__tools__tool_{i}",
            "description": f"Tool number {i}.",
            "input_schema": {
                "$schema": "http://json-schema.org/draft-07/schema#",
                "type": "object",
                "properties": {"path": {"type": "string"}},
                "required": None,
                "additionalProperties": False,
            },
        }
        for i in range(24)
    ]
    tools[-1]["cache_control"] = {"type": "ephemeral"}  # as Claude Code marks them: the last
    return {
        "model": MODEL,
        "max_tokens": 16,
        "system": [
            {"type": "text", "text": billing},
            {"type": "text", "text": "You are Claude Code, Anthropic's official CLI for Claude."},
            {"type": "text", "text": RULES, "cache_control": {"type": "ephemeral"}},
        ],
        "messages": history,
        "tools": tools,
        "tool_choice": {"type": "auto"},
        "thinking": {"type": "enabled", "budget_tokens": 1024},
        "metadata": {
            "user_id": json.dumps(
                {"device_id": "ab" * 32, "account_uuid": "", "session_id": session}
            )
        },
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        "output_config": {"effort": "low"},
    }


def stream_like_claude_code(server: Server, body: dict[str, Any]) -> tuple[list[str], Any]:
    """Stream through the SDK's beta namespace (`?beta=true`, `anthropic-beta`), with Claude
    Code's headers; returns the event types and the accumulated message."""
    sdk = client(server, auth_token="local-token")
    headers = {"x-app": "cli", "user-agent": "claude-cli/2.1.37 (external, cli)"}
    known = {k: v for k, v in body.items() if k not in ("context_management", "output_config")}
    extra = {k: body[k] for k in ("context_management", "output_config")} | {"temperature": 0}
    with sdk.beta.messages.stream(
        **known, betas=BETAS, extra_headers=headers, extra_body=extra
    ) as stream:
        types: list[str] = [event.type for event in stream]
        return types, stream.get_final_message()


def test_a_claude_code_session_streams_and_its_next_turn_reads_the_cache(server: Server) -> None:
    session = str(uuid.uuid4())
    history: list[dict[str, Any]] = [
        {"role": "user", "content": [{"type": "text", "text": "Which file holds the server?"}]}
    ]
    first_body = claude_code_body(history, session)
    types, first = stream_like_claude_code(server, first_body)
    assert types[0] == "message_start" and types[-1] == "message_stop"
    assert "content_block_start" in types and "message_delta" in types
    assert first.stop_reason in ("end_turn", "max_tokens") and text_of(first)
    usage = first.usage
    cache = (usage.cache_read_input_tokens or 0) + (usage.cache_creation_input_tokens or 0)
    prompt = usage.input_tokens + cache
    assert prompt > 1000  # the long system prompt reached the model

    history += [
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "", "signature": ""},
                {"type": "text", "text": text_of(first)},
            ],
        },
        {"role": "user", "content": [{"type": "text", "text": "Thanks. And the tests?"}]},
    ]
    second_body = claude_code_body(history, session)  # a new billing hash
    assert second_body["system"][0] != first_body["system"][0]
    _, second = stream_like_claude_code(server, second_body)
    # The whole first prompt is reused though its first system block changed.
    assert second.usage.cache_read_input_tokens >= prompt - 1
    agent = httpx.get(f"{server.url}/v1/agents/{session}", timeout=10)
    assert agent.status_code == 200 and agent.json()["requests"] == 2
