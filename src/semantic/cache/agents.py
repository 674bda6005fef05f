"""Agents: whose history is which blocks, what that means for eviction (shared, working, idle,
pinned), the direct agent API's conversations and turns, and persistence of agents.

Everything here runs on the engine thread except `PendingPersist.wait` and `save_manifest`, on
any thread: they read agents without a lock; manifest writes are serialized by
`Agents.manifest_lock`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from semantic.cache.block_pool import (
    TIER_IDLE_AGENT,
    TIER_OUT_OF_WINDOW,
    TIER_SHARED,
    TIER_WORKING_AGENT,
    BlockPool,
)
from semantic.cache.cache_stats import AgentStats, CacheStats, Served
from semantic.cache.conversation import Conversation
from semantic.cache.manifest import AgentManifest, delete_manifest, list_manifests, save_manifest
from semantic.cache.prefix import PrefixCache, split_key
from semantic.cache.tiering import PendingWrites, Tiering
from semantic.core import History, Request
from semantic.errors import Conflict, NotFound

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Agent:
    agent_id: str
    block_hashes: list[int] = field(default_factory=list)
    tail_hash: int | None = None
    num_tokens: int = 0
    pinned: bool = False
    working: bool = False  # heard from within `idle_s`: its blocks sit in the working tier
    stats: AgentStats = field(default_factory=AgentStats)
    # The dialogue the direct agent API keeps (None for agents only chat requests named), and
    # the id of the generate call holding it, if one is: one turn at a time, never interleaved.
    conversation: Conversation | None = None
    turn: str | None = None

    @property
    def hashes(self) -> list[int]:
        return [*self.block_hashes, *([self.tail_hash] if self.tail_hash is not None else [])]


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
    and the manifests of the agents whose blocks all made it are written."""

    def __init__(self, owner: Agents, agents: list[Agent], writes: PendingWrites) -> None:
        self.owner = owner
        self.agents = agents
        self.writes = writes

    def wait(self, timeout: float | None = None) -> PersistResult:
        writes = self.writes
        if not writes.wait(timeout):
            return PersistResult(0, writes.submitted, 0, len(self.agents))
        # An agent with nothing cached and no conversation has nothing to keep.
        worth = [a for a in self.agents if a.hashes or a.conversation is not None]
        complete = [a for a in worth if not writes.failed & set(a.hashes)]
        saved = sum(self.owner.save_manifest(agent) for agent in complete)
        written = writes.submitted - len(writes.failed)
        return PersistResult(written, len(writes.failed), saved, len(worth) - saved)


class Agents:
    """The agents of one model's cache, named ones with their histories, and the statistics of
    every request.

    Invariants: an agent's `hashes` name its last history; `_sharers[h]` counts the agents whose
    history contains `h` (two or more puts the block in the shared tier); a pinned agent's hot
    blocks hold one pin reference each; an agent is held by at most one generate call (`turn`).
    Manifests are written on `persist` and at shutdown, never after every turn, except for
    agents with a conversation (the agent API): theirs is written at each turn, a few bytes that
    cannot be computed again. Blocks need no manifest to be found: a prompt walks its chain in
    memory and on disk alike (`cache/prefix.py`).
    """

    def __init__(self, prefix: PrefixCache, tiering: Tiering, *, idle_s: float) -> None:
        self.prefix = prefix
        self.pool: BlockPool = prefix.pool
        self.tiering = tiering
        self.idle_s = idle_s
        self.stats = CacheStats(tiering)
        self.by_id: dict[str, Agent] = {}
        self._sharers: Counter[int] = Counter()
        self._pins: dict[str, list[int]] = {}
        # Held while a manifest is written or deleted: a write that lost the race with a delete
        # must not bring the agent back.
        self.manifest_lock = threading.Lock()
        self._next_sweep = 0.0
        for manifest in list_manifests(self.model_root):
            self._remember(manifest)

    @property
    def model_root(self) -> Path:
        return self.tiering.disk.model_root

    # -- on the engine thread ---------------------------------------------------------------

    def begin(self, request: Request) -> None:
        """A request of an agent arrived (creating the agent on first sight)."""
        if request.agent_id is None:
            return
        agent = self.by_id.setdefault(request.agent_id, Agent(request.agent_id))
        agent.working = True
        agent.stats.last_used = time.time()

    def finished(
        self,
        request: Request,
        history: History,
        cached: int,
        from_disk: int,
        missing: int | None,
    ) -> None:
        """Account for a finished request — `cached` of its prompt's tokens reused, `from_disk`
        of them read back from disk, `missing` the first block of it cached nowhere — and make
        its history the agent's."""
        agent_id = request.agent_id
        agent = None if agent_id is None else self.by_id.setdefault(agent_id, Agent(agent_id))
        reason = self.stats.miss_reason(
            agent_id,
            missing,
            cached,
            known_here=agent is not None and bool(agent.stats.requests or agent.hashes),
            agent_had_missing=agent is not None and missing in agent.block_hashes,
        )
        served = Served(cached, from_disk, len(request.prompt_token_ids), reason)
        self.stats.record(served, None if agent is None else agent.stats, time.time())
        if agent is not None and history.num_tokens:  # aborted before it ran: history as it was
            self._set_history(agent, history)

    def _set_history(self, agent: Agent, history: History) -> None:
        old, old_windows = set(agent.hashes), self._window_keys(agent)
        agent.block_hashes, agent.tail_hash = history.block_hashes, history.tail_hash
        agent.num_tokens = history.num_tokens
        new = set(agent.hashes)
        self._sharers.update(new - old)
        self._sharers -= Counter(old - new)  # `-=` drops hashes no agent shares any more
        for key, page in self._history_pages(agent):
            if self._sharers[split_key(key)[0]] >= 2:
                self.pool.retier(page, TIER_SHARED)
        if agent.pinned:
            self._pin(agent)
        self._let_go_of_passed(agent, old_windows - self._window_keys(agent))

    def _let_go_of_passed(self, agent: Agent, passed: set[int]) -> None:
        """Sliding pages the agent's last history read and its new one does not (its window
        moved past them, or its tail grew into a new block): unless another agent's history
        still reads them, cached ones go to the out-of-window tier (reclaimed first, never
        written) and their files are deleted, so a history persisted at every turn keeps one
        window of sliding pages on disk as in memory. A page held by a running request is
        left to it; a write still queued lands later, for the disk budget to drop."""
        if any(self._sharers[split_key(key)[0]] > 1 for key in passed):
            for other in self.by_id.values():
                if other is not agent:
                    passed -= self._window_keys(other)
        for key in passed:
            page = self.pool.lookup(key)
            if page is not None:
                self.pool.retier(page, TIER_OUT_OF_WINDOW)  # only a cached page moves
            if self.tiering.disk.contains(key):
                self.tiering.disk.delete(key)

    def _window_keys(self, agent: Agent) -> set[int]:
        """The sliding groups' page keys the agent's next turn reads."""
        keys = self.prefix.history_keys(agent.hashes, agent.num_tokens)
        return {key for key in keys if self.prefix.is_sliding(key)}

    def sweep(self, now: float | None = None) -> None:
        """Move agents not heard from within `idle_s` to the idle tier, and with them the
        blocks of conversations without a name cached that long ago (at most once a second)."""
        now = time.time() if now is None else now
        if now < self._next_sweep:
            return
        self._next_sweep = now + 1.0
        self.pool.demote_idle(self.idle_s)
        for agent in self.by_id.values():
            if agent.working and now - agent.stats.last_used > self.idle_s:
                agent.working = False
                for _, page in self._history_pages(agent):
                    if self.pool.tier_of(page) == TIER_WORKING_AGENT:
                        self.pool.retier(page, TIER_IDLE_AGENT)

    def pin(self, agent_id: str, pinned: bool = True) -> None:
        """A pinned agent's hot blocks never leave memory, nor its files the disk."""
        agent = self.by_id.setdefault(agent_id, Agent(agent_id))
        agent.pinned = pinned
        if pinned:
            self._pin(agent)
        else:
            self.pool.release(self._pins.pop(agent_id, []), TIER_WORKING_AGENT)
        self._protect_pinned()

    def _protect_pinned(self) -> None:
        """The disk budget never drops the files of a pinned agent."""
        pinned = frozenset(h for a in self.by_id.values() if a.pinned for h in a.hashes)
        self.tiering.protected = pinned

    def _pin(self, agent: Agent) -> None:
        """Hold the pages the agent's next turn reads, and let go of those held for its last
        history (those its window moved past then leave as out of the window:
        `_let_go_of_passed`)."""
        pages = [page for _, page in self._history_pages(agent)]
        for page in pages:
            self.pool.acquire(page)
        self.pool.release(self._pins.pop(agent.agent_id, []), TIER_WORKING_AGENT)
        self._pins[agent.agent_id] = pages

    def _history_pages(self, agent: Agent) -> list[tuple[int, int]]:
        """(key, page) of the pool pages the agent's next turn reads."""
        return self.prefix.history_pages(agent.hashes, agent.num_tokens)

    # -- the direct agent API: conversations, turns, forks (on the engine thread) -----------

    def create(self, agent_id: str, conversation: Conversation) -> Agent:
        """A new agent with a conversation and nothing cached yet; Conflict if the id is taken
        (the engine thread runs one call at a time, so of two creates of one id exactly one
        wins). The caller then writes its manifest with `save_manifest`."""
        if agent_id in self.by_id:
            raise Conflict(f"agent {agent_id!r} already exists")
        agent = self.by_id[agent_id] = Agent(agent_id, conversation=conversation)
        agent.stats.last_used = time.time()
        return agent

    def fork(self, parent_id: str, child_id: str) -> Agent:
        """A new agent with a copy of the parent's conversation whose cache is the parent's:
        the same blocks by hash, in memory or on disk, so the fork costs no block. Either side
        extending the shared partial tail copies it first (the scheduler's copy-on-write);
        deleting one keeps every block the other still names."""
        parent = self.by_id.get(parent_id)
        if parent is None:
            raise NotFound(f"no agent {parent_id!r}")
        child = self.create(child_id, parent.conversation or Conversation())
        history = History(list(parent.block_hashes), parent.tail_hash, parent.num_tokens)
        self._set_history(child, history)
        return child

    def begin_turn(self, agent_id: str, turn_id: str) -> Conversation:
        """Hold the agent for one generate call and return its conversation so far; NotFound,
        or Conflict while another call holds it."""
        agent = self.by_id.get(agent_id)
        if agent is None:
            raise NotFound(f"no agent {agent_id!r}")
        if agent.turn is not None:
            raise Conflict(f"agent {agent_id!r} is already generating")
        agent.turn = turn_id
        return agent.conversation or Conversation()

    def end_turn(
        self, agent_id: str, turn_id: str, conversation: Conversation | None = None
    ) -> Agent | None:
        """Release the agent held by `turn_id`, making `conversation` its own when given (the
        turn's reply). Returns the agent, or None when that turn no longer holds it (it was
        ended already: releasing twice never frees a later turn's hold)."""
        agent = self.by_id.get(agent_id)
        if agent is None or agent.turn != turn_id:
            return None
        agent.turn = None
        if conversation is not None:
            agent.conversation = conversation
        return agent

    def start_persist(self, agent_ids: Iterable[str] | None = None) -> PendingPersist:
        """Queue writes of the named agents' hot pages (every hashed page worth keeping when
        None) that are not on disk yet. Runs on the engine thread (it reads the pool);
        `PendingPersist.wait` then waits for durability on any thread and writes the
        manifests."""
        everything = agent_ids is None
        agents = (
            list(self.by_id.values())
            if everything
            else [self.by_id[a] for a in agent_ids or () if a in self.by_id]
        )
        pages = (
            dict(self.prefix.hot_pages())
            if everything
            else {key: page for a in agents for key, page in self._history_pages(a)}
        )
        hot = []
        for key, page in pages.items():
            content = self.prefix.content(split_key(key)[0])
            if content is not None:
                hot.append((page, key, *content))
        return PendingPersist(self, agents, self.tiering.start_persist(hot))

    def persist(
        self, agent_ids: Iterable[str] | None = None, timeout: float | None = None
    ) -> PersistResult:
        """`start_persist` and wait for it, on the calling (engine) thread."""
        return self.start_persist(agent_ids).wait(timeout)

    def evict(self, agent_ids: Iterable[str] | None = None) -> int:
        """Free the pool pages of the named agents (of every page when None) that are on disk
        and that neither a running request nor a pin holds; returns how many. `persist` first:
        a page not on disk stays, so an eviction never loses a cache."""
        if agent_ids is None:
            keys = [key for key, _ in self.prefix.hot_pages()]
        else:
            agents = [self.by_id[a] for a in agent_ids if a in self.by_id]
            keys = [k for agent in agents for h in agent.hashes for k in self.prefix.keys(h)]
        evicted = sum(self.prefix.discard(k) for k in keys if self.tiering.disk.contains(k))
        self.tiering.count_evicted_on_request(evicted)
        return evicted

    def delete(self, agent_id: str) -> bool:
        """Forget an agent: its manifest (conversation included), and the blocks no other agent
        uses, in memory (cached ones; a block a running request holds stays until it finishes)
        and on disk. Conflict while a generate call holds it."""
        agent = self.by_id.get(agent_id)
        if agent is None:
            return False
        if agent.turn is not None:
            raise Conflict(f"agent {agent_id!r} is generating; delete it once the call ends")
        with self.manifest_lock:
            del self.by_id[agent_id]
            delete_manifest(self.model_root, agent_id)
        self.pool.release(self._pins.pop(agent_id, []), TIER_WORKING_AGENT)
        if agent.pinned:
            self._protect_pinned()
        self._sharers -= Counter(agent.hashes)
        for block_hash in agent.hashes:
            if self._sharers[block_hash] <= 0:
                for key in self.prefix.keys(block_hash):
                    self.prefix.discard(key)
                    self.tiering.disk.delete(key)
        return True

    def snapshot(self) -> dict[str, Any]:
        """Totals and every agent's statistics, as plain data (taken on the engine thread)."""
        agents = [self.describe(a) for a in sorted(self.by_id)]
        return {"totals": self.stats.totals(), "agents": agents}

    def describe(self, agent_id: str) -> dict[str, Any] | None:
        agent = self.by_id.get(agent_id)
        if agent is None:
            return None
        hot = self._history_pages(agent)
        keys = [key for block_hash in agent.hashes for key in self.prefix.keys(block_hash)]
        stats = agent.stats
        return {
            "agent_id": agent.agent_id,
            "cached_tokens": agent.num_tokens,
            "pinned": agent.pinned,
            "working": agent.working,
            "requests": stats.requests,
            "hit_tokens": stats.hit_tokens,
            "disk_hit_tokens": stats.disk_hit_tokens,
            "miss_tokens": stats.miss_tokens,
            "miss_reasons": dict(stats.miss_reasons),
            "bytes_in_memory": len(hot) * self.tiering.disk.spec.bytes_per_page,
            # what every layer's K/V of its blocks would take: more with sliding windows
            "bytes_full_attention": len(agent.hashes) * self.tiering.disk.spec.bytes_per_block,
            "bytes_on_disk": sum(self.tiering.disk.size_of(key) for key in keys),
            "last_used": stats.last_used,
            "generating": agent.turn is not None,
            "conversation": _summary(agent.conversation),
        }

    def save_manifest(self, agent: Agent) -> bool:
        """Write the agent's manifest as it is now, on any thread (it does disk I/O: not the
        engine thread's). False when it failed, or when the agent was deleted meanwhile."""
        with self.manifest_lock:
            if self.by_id.get(agent.agent_id) is not agent:
                return False  # deleted (perhaps created again): this file is not ours any more
            manifest = AgentManifest(
                agent.agent_id,
                self.model_root.name,
                list(agent.block_hashes),
                agent.tail_hash,
                agent.num_tokens,
                pinned=agent.pinned,
                conversation=agent.conversation,
            )
            try:
                save_manifest(self.model_root, manifest)
            except OSError as exc:
                log.warning("manifest of agent %s not saved: %s", agent.agent_id, exc)
                return False
        return True

    def _remember(self, manifest: AgentManifest) -> None:
        agent = Agent(
            manifest.agent_id,
            list(manifest.block_hashes),
            manifest.tail_hash,
            manifest.num_tokens,
            manifest.pinned,
            conversation=manifest.conversation,
        )
        agent.stats.last_used = manifest.updated_at
        self.by_id[agent.agent_id] = agent
        self._sharers.update(agent.hashes)
        if agent.pinned:
            self.tiering.protected = self.tiering.protected | set(agent.hashes)


def _summary(conversation: Conversation | None) -> dict[str, Any] | None:
    if conversation is None:
        return None
    return {
        "system": conversation.system,
        "defaults": conversation.defaults.to_json(),
        "messages": len(conversation.messages),
    }
