"""What the engine publishes of its state for the metrics: a snapshot taken on the engine thread
between two steps, immutable after, so a reader never reaches into the pool or the scheduler."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(slots=True, frozen=True)
class EngineStats:
    """The queue and the pool, by size: read off the engine thread too (`Engine.stats`)."""

    running: int
    waiting: int
    blocks_total: int
    blocks_held: int
    blocks_cached: int
    blocks_free: int


@dataclass(slots=True, frozen=True)
class EngineSnapshot:
    """The engine as /metrics reads it (`observability.py: read_engine`). Its mappings are
    copies, never the engine's own."""

    model: str
    stats: EngineStats
    bytes_per_page: int  # one page of the pool: a layer group's K/V of one block
    reclaimed: Mapping[int, int]  # cached pages the pool reclaimed for reuse, by eviction tier
    preemptions: int  # sequences the scheduler preempted to make room, since start
    agents_active: int  # agents heard from within `agent_idle_s`
    agents_idle: int
    cache: Mapping[str, Any]  # the cache statistics' totals, as /admin/cache shows them
