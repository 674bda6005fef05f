"""The target's own cache counters, as semantic's `GET /admin/cache` reports them (`totals`), and
their difference over a phase: where the prompt tokens came from, why they missed, and the
blocks that went to and came back from disk. Other servers (vLLM, llama.cpp) have no such
endpoint: there the counters are None and a report says "unknown"."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import httpx

ADMIN_CACHE_PATH = "/admin/cache"


@dataclass(slots=True, frozen=True)
class CacheCounters:
    """Counts since the server started (or, after `since`, over a phase). Tokens are prompt
    tokens; the disk figures are blocks."""

    hit_tokens_memory: int
    hit_tokens_disk: int
    miss_tokens: int  # prefilled
    evicted_to_disk: int  # written because the pool reclaimed them
    restored: int  # read back from disk for a prompt
    evicted_from_disk: int  # dropped by the disk budget
    persisted: int  # written by an explicit persist
    miss_reasons: dict[str, int]  # why a prompt was not all served from cache → requests
    written_behind: int = 0  # written behind named agents' turns (0 from a server without)

    @classmethod
    def of(cls, totals: dict[str, Any]) -> CacheCounters:
        """From `/admin/cache`'s `totals`; a missing or non-integer count raises ValueError."""
        counts = {
            f.name: _count(totals.get(f.name, 0 if f.name == "written_behind" else None))
            for f in fields(cls)
            if f.name != "miss_reasons"
        }
        reasons = totals.get("miss_reasons")
        if not isinstance(reasons, dict):
            raise ValueError("miss_reasons is not an object")
        return cls(**counts, miss_reasons={str(k): _count(v) for k, v in reasons.items()})

    def since(self, before: CacheCounters) -> CacheCounters:
        """What happened between `before` and this reading; reasons that did not recur drop out."""
        counts = {
            f.name: getattr(self, f.name) - getattr(before, f.name)
            for f in fields(self)
            if f.name != "miss_reasons"
        }
        reasons = {
            reason: count - before.miss_reasons.get(reason, 0)
            for reason, count in self.miss_reasons.items()
        }
        return CacheCounters(**counts, miss_reasons={r: n for r, n in reasons.items() if n})

    @property
    def disk_writes(self) -> int:
        return self.evicted_to_disk + self.persisted + self.written_behind


def _count(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"expected a count, got {value!r}")
    return value


async def read_cache_counters(client: httpx.AsyncClient) -> CacheCounters | None:
    """The target's counters now; None where it has no `/admin/cache` (another server, or one
    that wants an admin key this run lacks) or answers it in another shape."""
    try:
        response = await client.get(ADMIN_CACHE_PATH)
        if response.status_code != 200:
            return None
        body = response.json()
        return CacheCounters.of(body["totals"])
    except (httpx.HTTPError, ValueError, KeyError, TypeError):
        return None


@dataclass(slots=True, frozen=True)
class AgentKV:
    """What the target's pool holds for one agent (`/admin/cache`): the bytes its next turn
    reads, and what every layer's K/V of the same blocks would take (more than `held` for a
    model with sliding windows, which keep only theirs)."""

    held: int
    full_attention: int

    @property
    def share(self) -> float | None:
        return self.held / self.full_attention if self.full_attention else None


async def read_agent_kv(client: httpx.AsyncClient, agent_id: str) -> AgentKV | None:
    """The KV the target holds for `agent_id`; None where it has no `/admin/cache`, or does not
    know the agent or say those figures."""
    try:
        response = await client.get(ADMIN_CACHE_PATH)
        if response.status_code != 200:
            return None
        agent = next(a for a in response.json()["agents"] if a["agent_id"] == agent_id)
        return AgentKV(_count(agent["bytes_in_memory"]), _count(agent["bytes_full_attention"]))
    except (httpx.HTTPError, ValueError, KeyError, TypeError, StopIteration):
        return None


def counters_over(
    before: CacheCounters | None, after: CacheCounters | None
) -> CacheCounters | None:
    """The difference of two readings; None unless both were read."""
    if before is None or after is None:
        return None
    return after.since(before)
