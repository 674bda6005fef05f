"""Persisting agents: the writes `Agents.start_persist` queued, waited for on any thread, then
the manifests of the agents whose blocks all reached the disk; and what a persist or an
eviction did."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from semantic.cache.agents.agent import Agent
from semantic.cache.disk.tiering import PendingWrites
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
    """Writes queued by `Agents.start_persist`; `wait` returns once they are durable (or failed)
    and the manifests of the agents whose blocks all made it are written (`save_manifest`:
    `Agents.save_manifest`, False for an agent deleted meanwhile)."""

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
