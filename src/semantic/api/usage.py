"""Usage in each API's words, from the engine's `core.Usage`: Chat Completions' and legacy
Completions' (`chat_usage`), the Responses API's (`responses_usage`), and the Messages API's
(`messages_usage`, `final_usage`).

Anthropic's usage splits the prompt's tokens into read from the cache, written to it at the
request's breakpoints, and computed without either. As Anthropic defines them:
`cache_read_input_tokens` were served from the cache, `cache_creation_input_tokens` were
written to it for a breakpoint (past what was read, up to the furthest breakpoint),
`input_tokens` are the rest, after the last breakpoint; the three add up to the prompt.
`cache_creation` splits what was written by the time to live of the breakpoints it was written
for: up to the furthest 1h breakpoint as 1h, the rest as 5m.

Our cache also serves prefixes no breakpoint marked (every computed block is cached), so
without breakpoints `cache_read_input_tokens` is what the cache served and nothing is written:
a request never pays twice for the same token. A breakpoint keeps whole blocks, so what it
writes ends at the last block boundary before it (`Usage.retained_tokens`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from semantic.core import Usage


def chat_usage(usage: Usage) -> dict[str, Any]:
    """Usage in Chat Completions' and legacy Completions' words."""
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
    }


def responses_usage(usage: Usage, reasoning_tokens: int = 0) -> dict[str, Any]:
    """Responses usage: `input_tokens` is the whole prompt, of which `cached_tokens` came from
    the cache. We never bill a cache write (every prefilled token is cached anyway), so
    `cache_write_tokens`, which the SDK's type requires, is 0."""
    return {
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {"cached_tokens": usage.cached_tokens, "cache_write_tokens": 0},
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
    }


def messages_usage(
    prompt_tokens: int,
    cached_tokens: int,
    output_tokens: int,
    retained: Sequence[int] = (),
    labels: Sequence[str] = (),
) -> dict[str, object]:
    """The usage object: `retained[i]` tokens kept by the breakpoint whose ttl is `labels[i]`
    ("5m" or "1h")."""
    written = max(0, max(retained, default=0) - cached_tokens)
    long = [kept for kept, label in zip(retained, labels, strict=True) if label == "1h"]
    written_1h = max(0, max(long, default=0) - cached_tokens)
    return {
        "input_tokens": prompt_tokens - cached_tokens - written,
        "cache_creation_input_tokens": written,
        "cache_read_input_tokens": cached_tokens,
        "cache_creation": {
            "ephemeral_5m_input_tokens": written - written_1h,
            "ephemeral_1h_input_tokens": written_1h,
        },
        "output_tokens": output_tokens,
    }


def final_usage(usage: Usage, output_tokens: int, labels: Sequence[str]) -> dict[str, object]:
    """The usage of a finished request, whose breakpoints are labelled `labels`."""
    retained = usage.retained_tokens or (0,) * len(labels)
    return messages_usage(usage.prompt_tokens, usage.cached_tokens, output_tokens, retained, labels)
