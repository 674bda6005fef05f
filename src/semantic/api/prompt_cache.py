"""OpenAI's prompt cache fields, read alike by Chat Completions and Responses:
`prompt_cache_key` names the conversation (an agent, where nothing more specific does), and
`prompt_cache_retention` says how long its prompt is kept: `in_memory` is the cache's own way
(its blocks leave when the pool needs them, to disk first), `24h` keeps the whole prompt's
blocks a day (`cache/agents/retention.py`), cut to the server's longest time to live."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from semantic.api.agents import agent_id_from, named_agent
from semantic.core import Breakpoint

PromptCacheRetention = Literal["in_memory", "24h"]
LONG_RETENTION_S = 86_400.0


def prompt_cache_agent(
    headers: Mapping[str, str], session_id: str | None, prompt_cache_key: str | None
) -> str | None:
    """The agent a request names: `session_id`, else `x-session-id`, else its
    `prompt_cache_key` (as an agent id: itself when valid, else a digest of it); else none."""
    named = named_agent(headers, session_id, param="session_id")
    if named is not None or not prompt_cache_key:
        return named
    return agent_id_from(prompt_cache_key)


def retention_of(
    retention: PromptCacheRetention | None, prompt_tokens: int, max_ttl_s: float
) -> tuple[Breakpoint, ...]:
    """The breakpoint `retention` asks for: the whole prompt for a day (`24h`), none
    otherwise, nor when the server keeps nothing that long (`max_ttl_s` 0)."""
    if retention != "24h" or max_ttl_s <= 0:
        return ()
    return (Breakpoint(prompt_tokens, min(LONG_RETENTION_S, max_ttl_s)),)
