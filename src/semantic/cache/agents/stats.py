"""The cache's statistics: prompt tokens served from memory, from disk and prefilled, in total
and per agent, and why a request missed. Updated on the engine thread as requests finish; read
by /admin/cache and /metrics from any thread, under `CacheStats.lock`."""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from semantic.cache.agents.manifest import has_manifest
from semantic.cache.disk.index import GONE_CORRUPT, GONE_EVICTED
from semantic.cache.disk.tiering import DiskTraffic, Tiering
from semantic.core import AgentKey

# Why a request's prompt was not all served from cache (besides its new tokens).
MISS_NOTHING_CACHED = "nothing_cached"
MISS_EVICTED = GONE_EVICTED  # it was cached; the memory and disk budgets let it go
MISS_CORRUPT = GONE_CORRUPT  # it was on disk but failed its checks
MISS_OTHER_MODEL = "other_model"


@dataclass(slots=True)
class AgentStats:
    requests: int = 0
    hit_tokens: int = 0  # prompt tokens served from cache, memory or disk
    disk_hit_tokens: int = 0  # of those, read back from disk
    miss_tokens: int = 0  # prompt tokens prefilled
    miss_reasons: Counter[str] = field(default_factory=Counter)
    last_used: float = 0.0


@dataclass(slots=True)
class RequestCounters:
    """Prompt tokens since start, in the shape Prometheus counters want."""

    hit_tokens_memory: int = 0
    hit_tokens_disk: int = 0
    miss_tokens: int = 0
    miss_reasons: Counter[str] = field(default_factory=Counter)


@dataclass(slots=True, frozen=True)
class Served:
    """How one finished request's prompt was served: `cached` tokens reused (`from_disk` of them
    read back from disk) out of `prompt`, and why the rest missed, if it did."""

    cached: int
    from_disk: int
    prompt: int
    miss_reason: str | None


class CacheStats:
    """Counts every request's prompt tokens, in total and for its agent."""

    def __init__(self, tiering: Tiering) -> None:
        self.tiering = tiering
        self.counters = RequestCounters()
        self.lock = threading.Lock()

    def miss_reason(
        self,
        agent: AgentKey | None,
        missing: int | None,
        cached: int,
        *,
        known_here: bool,
        agent_had_missing: bool,
    ) -> str | None:
        """Why reusable history was not found: the story of the first block of the prompt that
        was cached nowhere (`missing`); `nothing_cached` when nothing was reused at all.
        `known_here`: the agent the request named has a history here; `agent_had_missing`: the
        missing block was in it."""
        if missing is not None:
            gone = self.tiering.why_gone(missing)
            if gone is not None:
                return gone
            if agent_had_missing:
                return MISS_EVICTED  # gone too long ago for the disk to remember
        if cached:
            return None
        if agent is not None and not known_here and self.known_elsewhere(agent):
            return MISS_OTHER_MODEL
        return MISS_NOTHING_CACHED

    def known_elsewhere(self, agent: AgentKey) -> bool:
        """Whether another model's cache has this agent (its cache cannot serve this model)."""
        own = self.tiering.disk.model_root
        others = (root for root in own.parent.iterdir() if root != own and root.is_dir())
        return any(has_manifest(root, agent) for root in others)

    def record(self, served: Served, agent: AgentStats | None, now: float) -> None:
        with self.lock:
            self.counters.hit_tokens_memory += served.cached - served.from_disk
            self.counters.hit_tokens_disk += served.from_disk
            self.counters.miss_tokens += served.prompt - served.cached
            if served.miss_reason is not None:
                self.counters.miss_reasons[served.miss_reason] += 1
        if agent is None:
            return
        agent.requests += 1
        agent.hit_tokens += served.cached
        agent.disk_hit_tokens += served.from_disk
        agent.miss_tokens += served.prompt - served.cached
        agent.last_used = now
        if served.miss_reason is not None:
            agent.miss_reasons[served.miss_reason] += 1

    def totals(self) -> dict[str, Any]:
        """Request counters, disk traffic and the disk's use, as plain data (/admin/cache and
        /metrics)."""
        disk = self.tiering.disk.stats
        with self.lock:
            totals = asdict(self.counters)
            # asdict rebuilds a Counter from (key, count) pairs, counting the pairs
            totals["miss_reasons"] = dict(self.counters.miss_reasons)
        with self.tiering.lock:
            traffic: DiskTraffic = self.tiering.traffic
            totals |= asdict(traffic)
        return totals | {
            "disk_files": disk.files,
            "disk_bytes": disk.bytes,
            "quarantined": dict(disk.quarantined),
        }
