"""The agents store: the one object the engine holds for its agents, built from the rooms that
each own one concern, and the calls the engine and its agent door make, each passed to its
owner. It decides nothing itself; what each room owns:

- `registry.py`: which agents there are, per owner, the blocks their histories name, the
  requests in flight that name them;
- `ledger.py`: a request's arrival, cache-miss diagnosis and end (statistics, history);
- `histories.py`: the tiers of history pages (shared, working, idle, out of the window);
- `holds.py`: pins and retained prefixes, and what the disk budget protects;
- `lifecycle.py`: named agents created within their owners' limits, forked, held by a turn,
  deleted;
- `records.py`: the manifests on disk; `persist.py`: persist and evict on request;
- `describe.py`: an agent as plain data.

Agents are keyed by `AgentKey`: an id within its owner's scope. Who may see which agent is not
decided here but in `engine/agent_door.py`, the API's one way in. Everything runs on the engine
thread except `PendingPersist.wait` and `save_manifest`, on any thread (`records.py`).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from semantic.cache.agents.agent import Agent
from semantic.cache.agents.conversation import Conversation
from semantic.cache.agents.describe import describe
from semantic.cache.agents.histories import Histories
from semantic.cache.agents.holds import Holds
from semantic.cache.agents.ledger import Ledger
from semantic.cache.agents.lifecycle import Lifecycle
from semantic.cache.agents.manifest import ManifestFiles
from semantic.cache.agents.misses import RecentMisses
from semantic.cache.agents.persist import PendingPersist, Persister, PersistResult
from semantic.cache.agents.records import AgentRecords
from semantic.cache.agents.registry import AgentRegistry
from semantic.cache.agents.retention import Retentions
from semantic.cache.agents.stats import CacheStats
from semantic.cache.disk.tiering import Tiering
from semantic.cache.pages.prefix import PrefixCache, PrefixMatch
from semantic.core import AgentKey, CacheMiss, History, Request
from semantic.settings.options import AgentOptions


class Agents:
    """The agents of one model's cache, named ones with their histories, and the statistics of
    every request: the rooms above, wired together."""

    def __init__(
        self,
        prefix: PrefixCache,
        tiering: Tiering,
        manifests: ManifestFiles,
        options: AgentOptions,
    ) -> None:
        self.prefix = prefix
        self.tiering = tiering
        self.options = options
        self.registry = AgentRegistry(options.max_conversation_bytes_per_key)
        self.records = AgentRecords(manifests, self.registry, tiering)
        self.holds = Holds(prefix, tiering, self.registry, options)
        self.histories = Histories(prefix, tiering, self.registry, self.holds)
        self.lifecycle = Lifecycle(
            prefix, tiering, self.registry, self.records, self.holds, self.histories, options
        )
        self.ledger = Ledger(tiering, self.registry, self.lifecycle, self.histories)
        self.persister = Persister(prefix, tiering, self.registry, self.records)
        self._next_sweep = 0.0
        if any(agent.pinned for agent in self.records.load()):
            self.holds.protect()

    # -- what the rooms own, by name ---------------------------------------------------------

    @property
    def by_key(self) -> dict[AgentKey, Agent]:
        return self.registry.by_key

    @property
    def stats(self) -> CacheStats:
        return self.ledger.stats

    @property
    def misses(self) -> RecentMisses:
        return self.ledger.misses

    @property
    def retentions(self) -> Retentions:
        return self.holds.retentions

    @property
    def model_root(self) -> Path:
        return self.records.model_root

    def get(self, key: AgentKey) -> Agent | None:
        return self.registry.get(key)

    def names(self, block_hash: int) -> bool:
        return self.registry.names(block_hash)

    def census(self) -> tuple[int, int]:
        return self.registry.census()

    def describe(self, agent: Agent) -> dict[str, Any]:
        return describe(agent, self.prefix, self.tiering.disk)

    # -- a request's way through the cache (the engine's calls) ------------------------------

    def begin(self, request: Request) -> None:
        """A request arrived: its breakpoints make room among its owner's retentions
        (`Holds.make_room`), and an agent it names is created on first sight
        (`Ledger.begin`)."""
        self.holds.make_room(request)
        self.ledger.begin(request)

    def why_missed(self, request: Request, match: PrefixMatch, root: int) -> CacheMiss | None:
        return self.ledger.why_missed(request, match, root)

    def not_admitted(self, request: Request) -> None:
        self.ledger.not_admitted(request)

    def finished(
        self,
        request: Request,
        history: History,
        cached: int,
        from_disk: int,
        missing: int | None,
        answered: bool,
        miss: CacheMiss | None = None,
    ) -> Agent | None:
        return self.ledger.finished(request, history, cached, from_disk, missing, answered, miss)

    def retain(self, request: Request, history: History, cached: int) -> tuple[int, ...]:
        return self.holds.retain(request, history, cached)

    def sweep(self, now: float | None = None) -> None:
        """Expire retentions, and move agents not heard from within `idle_s` to the idle tier
        (`Histories.idle`), at most once a second."""
        now = time.time() if now is None else now
        if now < self._next_sweep:
            return
        self._next_sweep = now + 1.0
        self.holds.expire()
        self.histories.idle(now, self.options.idle_s)

    def let_go_of_pins(self) -> int:
        return self.holds.let_go()

    # -- the agent API's calls (through the engine's agent door) -----------------------------

    def pin(self, key: AgentKey, pinned: bool = True) -> Agent:
        """Pin or unpin a known agent (NotFound otherwise: pinning creates none)."""
        agent = self.registry.known(key)
        self.holds.pin(agent, pinned)
        return agent

    def create(self, key: AgentKey, conversation: Conversation) -> Agent:
        return self.lifecycle.create(key, conversation)

    def fork(self, parent_key: AgentKey, child_key: AgentKey) -> Agent:
        return self.lifecycle.fork(parent_key, child_key)

    def begin_turn(self, key: AgentKey, turn_id: str, message: str) -> tuple[Agent, Conversation]:
        return self.lifecycle.begin_turn(key, turn_id, message)

    def end_turn(self, key: AgentKey, turn_id: str) -> bool:
        return self.lifecycle.end_turn(key, turn_id)

    def delete(self, key: AgentKey) -> bool:
        return self.lifecycle.delete(key)

    def withdraw(self, agent: Agent) -> None:
        self.lifecycle.withdraw(agent)

    def save_manifest(
        self,
        agent: Agent,
        conversation: Conversation | None = None,
        history: History | None = None,
    ) -> bool:
        return self.records.save(agent, conversation, history)

    def start_persist(self, keys: Iterable[AgentKey] | None = None) -> PendingPersist:
        return self.persister.start(keys)

    def persist(
        self, keys: Iterable[AgentKey] | None = None, timeout: float | None = None
    ) -> PersistResult:
        """`start_persist` and wait for it, on the calling (engine) thread."""
        return self.persister.start(keys).wait(timeout)

    def evict(self, keys: Iterable[AgentKey] | None = None) -> int:
        return self.persister.evict(keys)
