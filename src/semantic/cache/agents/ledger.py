"""The requests the cache sees, from arrival to end: the agent a request names is created on
first sight (`Lifecycle.add`, within its owner's limit) and marked working; a prompt that
missed is diagnosed against its agent's last history (`misses.py`); a finished request is
counted in the cache's statistics (`stats.py`) and its history becomes its agent's.

On the engine thread.
"""

from __future__ import annotations

import time

from semantic.cache.agents.agent import Agent
from semantic.cache.agents.histories import Histories
from semantic.cache.agents.lifecycle import Lifecycle
from semantic.cache.agents.misses import Lookup, MissRecord, RecentMisses, diagnose
from semantic.cache.agents.registry import AgentRegistry
from semantic.cache.agents.stats import CacheStats, Served
from semantic.cache.disk.tiering import Tiering
from semantic.cache.pages.prefix import PrefixMatch
from semantic.core import CacheMiss, History, Request


class Ledger:
    def __init__(
        self,
        tiering: Tiering,
        registry: AgentRegistry,
        lifecycle: Lifecycle,
        histories: Histories,
    ) -> None:
        self.tiering = tiering
        self.registry = registry
        self.lifecycle = lifecycle
        self.histories = histories
        self.stats = CacheStats(tiering)
        self.misses = RecentMisses()

    def begin(self, request: Request) -> None:
        """A request arrived: an agent it names is created on first sight, within its owner's
        limit (TooManyAgents past it)."""
        key = request.agent
        if key is None:
            return
        agent = self.registry.get(key)
        if agent is None:
            agent = self.lifecycle.add(Agent(key))
        self.registry.began(request.request_id, agent)
        agent.working = True
        agent.stats.last_used = time.time()

    def why_missed(self, request: Request, match: PrefixMatch, root: int) -> CacheMiss | None:
        """Where and why the prompt of a request that `begin` saw missed the cache, as `match`
        (in the chain from `root`) found it on arrival: against its agent's last history, if
        it names one that has a history here."""
        agent, key = self.registry.began_on(request.request_id), request.agent
        history = None
        if agent is not None and agent.num_tokens:
            history = History(agent.block_hashes, agent.tail_hash, agent.num_tokens)
        lookup = Lookup(request.prompt_token_ids, match, root, history)
        return diagnose(
            lookup,
            self.tiering.why_gone,
            lambda: key is not None and self.stats.known_elsewhere(key),
        )

    def not_admitted(self, request: Request) -> None:
        """A request `begin` saw failed before it could run: it ends without `finished`."""
        self.registry.ended(request.request_id)

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
        """Account for a finished request — `cached` of its prompt's tokens reused, `from_disk`
        of them read back from disk, `missing` the first block of it cached nowhere, `miss`
        where and why it missed on arrival (kept among the recent misses) — and make
        its history the agent's, unless that agent was deleted while the request ran. A request
        not `answered` (aborted or failed) leaves an agent that has a history with it: a client
        sends its conversation again without the answer it stopped. Returns the agent whose
        history the request became (None when it named none, or left it as it was)."""
        began = self.registry.ended(request.request_id)
        agent = began if began is not None and self.registry.holds(began) else None
        key = None if agent is None else agent.key
        reason = self.stats.miss_reason(
            key,
            missing,
            cached,
            known_here=agent is not None and bool(agent.stats.requests or agent.hashes),
            agent_had_missing=agent is not None and missing in agent.block_hashes,
        )
        served = Served(cached, from_disk, len(request.prompt_token_ids), reason)
        now = time.time()
        self.stats.record(served, None if agent is None else agent.stats, now)
        if miss is not None:
            self.misses.add(MissRecord.of(request, miss, cached, now))
        # Aborted before it ran: nothing to keep. Not answered: the history it had, if any.
        if agent is not None and history.num_tokens and (answered or not agent.num_tokens):
            self.histories.adopt(agent, history, self.histories.found(agent, history, cached))
            return agent
        return None
