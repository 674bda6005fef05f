"""Anthropic cache breakpoints, end to end: a real server on SmolLM2 with a pool and a disk small
enough that fifty one-off requests push everything else out of both, and the Anthropic SDK.

Two system prompts of one length are sent once each, one with a `cache_control` breakpoint
and one without, and no session names either. After the flood the marked one is read back from
the cache (`cache_read_input_tokens` covers its breakpoint's prefix, written by the first
request as `cache_creation_input_tokens`), and the unmarked one, the control, is computed again:
the flood does evict, so the breakpoint is what kept the first."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anthropic
import pytest

from tests.e2e.conftest import Start

pytestmark = pytest.mark.e2e

BLOCK = 16
RULES = (
    "Answer in one short sentence. Cite the file and line you rely on. Never guess an API "
    "that the repository does not define. Prefer the standard library. Keep names as they are."
)
MARKED = "Reviewer for the billing service. " + RULES
PLAIN = "Reviewer for the payroll service. " + RULES  # as long, parted from the first token on


def system(text: str, breakpoint: bool) -> list[dict[str, Any]]:
    block: dict[str, Any] = {"type": "text", "text": text}
    return [block | {"cache_control": {"type": "ephemeral"}}] if breakpoint else [block]


def test_a_breakpoint_keeps_its_prefix_through_a_flood_that_evicts_the_unmarked_control(
    start: Start, tmp_path: Path
) -> None:
    server = start(
        tmp_path,
        "breakpoints",
        *("--block-tokens", str(BLOCK), "--cache-budget-mb", "8", "--disk-budget-mb", "1"),
    )
    sdk = anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0)

    misses: list[str] = []  # each answer's x-semantic-cache-miss header ("" for none)

    def ask(blocks: list[dict[str, Any]], question: str = "Is this change safe?") -> Any:
        body: dict[str, Any] = {
            "model": "claude-sonnet-4-6",
            "system": blocks,
            "messages": [{"role": "user", "content": question}],
        }
        raw = sdk.messages.with_raw_response.create(max_tokens=1, **body)
        misses.append(raw.headers.get("x-semantic-cache-miss", ""))
        counted = sdk.messages.count_tokens(**body).input_tokens
        usage = raw.parse().usage
        written, read = usage.cache_creation_input_tokens, usage.cache_read_input_tokens
        assert usage.input_tokens + written + read == counted  # the whole prompt, once
        split = usage.cache_creation
        assert split is not None and split.ephemeral_1h_input_tokens == 0
        assert split.ephemeral_5m_input_tokens == written
        return usage

    first = ask(system(MARKED, True))
    control = ask(system(PLAIN, False))
    assert first.cache_creation_input_tokens >= 2 * BLOCK
    assert first.cache_creation_input_tokens % BLOCK == 0
    assert control.cache_creation_input_tokens == 0  # nothing marked, nothing written
    for index in range(50):  # short, so the flood takes seconds: only its last tokens differ
        note = f"Ticket {index * 7}: three words?"
        sdk.messages.create(
            model="claude-sonnet-4-6",
            max_tokens=1,
            messages=[{"role": "user", "content": note}],
        )
    again = ask(system(MARKED, True), "And is this one?")
    assert again.cache_read_input_tokens >= first.cache_creation_input_tokens
    assert again.cache_creation_input_tokens == 0
    evicted = ask(system(PLAIN, False), "And is this one?")
    assert evicted.cache_read_input_tokens < BLOCK  # at most the template's opening tokens
    assert misses[-1].endswith("reason=evicted")  # it was cached, and the flood pushed it out
