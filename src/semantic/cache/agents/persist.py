"""Persisting and evicting agents on request: the writes of their hot pages queued on the
engine thread (`Persister.start`), waited for on any thread, then the manifests of the agents
whose blocks all reached the disk; pages freed from memory once on disk (`Persister.evict`);
and what a persist or an eviction did."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from semantic.cache.agents.agent import Agent, history_pages
from semantic.cache.agents.records import AgentRecords
from semantic.cache.agents.registry import AgentRegistry
from semantic.cache.disk.tiering import PendingWrites, Tiering
from semantic.cache.pages.prefix import PrefixCache, split_key
from semantic.core import AgentKey
from semantic.errors import PersistFailed


@dataclass(slots=True, frozen=True)
class PersistResult:
    blocks_written: int
    failed: int  # block writes
    agents_saved: int
    agents_failed: int = 0  # agents left as they were on disk: a block or the manifest failed


@dataclass(slots=True, frozen=True)
class EvictResult:
    persisted: PersistResult  # what was written first
    blocks_evicted: int  # freed from memory; the rest are held by running requests or pins


class PendingPersist:
    """Writes queued by `Persister.start`; `wait` returns once they are durable (or failed)
    and the manifests of the agents whose blocks all made it are written (`save_manifest`:
    `AgentRecords.save`, False for an agent deleted meanwhile)."""

    def __init__(
        self,
        agents: list[Agent],
        writes: PendingWrites,
        save_manifest: Callable[[Agent], bool],
    ) -> None:
        self.agents = agents
        self.writes = writes
        self.save_manifest = save_manifest

    def wait(self, timeout: float | None = None) -> PersistResult:
        writes = self.writes
        if not writes.wait(timeout):
            return PersistResult(0, writes.submitted, 0, len(self.agents))
        # An agent with nothing cached and no conversation has nothing to keep.
        worth = [a for a in self.agents if a.hashes or a.conversation is not None]
        complete = [a for a in worth if not writes.failed & set(a.hashes)]
        saved = sum(self._saved(agent) for agent in complete)
        written = writes.submitted - len(writes.failed)
        return PersistResult(written, len(writes.failed), saved, len(worth) - saved)

    def _saved(self, agent: Agent) -> bool:
        try:
            return self.save_manifest(agent)
        except PersistFailed:
            return False  # logged; the agent counts as not durable


class Persister:
    """Persist and evict, on the engine thread (they read the pool)."""

    def __init__(
        self,
        prefix: PrefixCache,
        tiering: Tiering,
        registry: AgentRegistry,
        records: AgentRecords,
    ) -> None:
        self.prefix = prefix
        self.tiering = tiering
        self.registry = registry
        self.records = records

    def start(self, keys: Iterable[AgentKey] | None = None) -> PendingPersist:
        """Queue writes of the named agents' hot pages (every hashed page worth keeping when
        None) that are not on disk yet. `PendingPersist.wait` then waits for durability on any
        thread and writes the manifests."""
        everything = keys is None
        agents = list(self.registry) if everything else self._known(keys or ())
        pages = (
            dict(self.prefix.hot_pages())
            if everything
            else {key: page for a in agents for key, page in history_pages(self.prefix, a)}
        )
        hot = []
        for key, page in pages.items():
            content = self.prefix.content(split_key(key)[0])
            if content is not None:
                hot.append((page, key, *content, self.prefix.marks_history_end(key)))
        return PendingPersist(agents, self.tiering.start_persist(hot), self.records.save)

    def evict(self, keys: Iterable[AgentKey] | None = None) -> int:
        """Free the pool pages of the named agents (of every page when None) that are on disk
        and that neither a running request nor a pin holds; returns how many. Persist first:
        a page not on disk stays, so an eviction never loses a cache."""
        if keys is None:
            pages = [key for key, _ in self.prefix.hot_pages()]
        else:
            agents = self._known(keys)
            pages = [k for agent in agents for h in agent.hashes for k in self.prefix.keys(h)]
        evicted = sum(self.prefix.discard(k) for k in pages if self.tiering.on_disk(k))
        self.tiering.count_evicted_on_request(evicted)
        return evicted

    def _known(self, keys: Iterable[AgentKey]) -> list[Agent]:
        """The agents of `keys` that there are (an unknown key names nothing to write)."""
        return [agent for key in keys if (agent := self.registry.get(key)) is not None]
