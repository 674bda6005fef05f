"""Where the pages of agents' histories sit in the pool's eviction order: a block two agents'
histories name goes to the shared tier, a pinned agent's history is held by its pin, sliding
pages its window moved past go to the out-of-window tier (and off the disk), and the history of
an agent not heard from within `idle_s` goes to the idle tier. What each tier means, and which
goes first, is `cache/pages/block_pool.py`'s.

On the engine thread.
"""

from __future__ import annotations

from semantic.cache.agents.agent import Agent, history_pages
from semantic.cache.agents.holds import Holds
from semantic.cache.agents.registry import AgentRegistry
from semantic.cache.disk.tiering import Tiering
from semantic.cache.pages.block_pool import (
    TIER_IDLE_AGENT,
    TIER_OUT_OF_WINDOW,
    TIER_SHARED,
    TIER_WORKING_AGENT,
)
from semantic.cache.pages.prefix import PrefixCache, split_key
from semantic.core import History


class Histories:
    """Invariant: an agent's `hashes` name its last history, the first `found_blocks` of them
    found cached (not computed by it)."""

    def __init__(
        self, prefix: PrefixCache, tiering: Tiering, registry: AgentRegistry, holds: Holds
    ) -> None:
        self.prefix = prefix
        self.pool = prefix.pool
        self.tiering = tiering
        self.registry = registry
        self.holds = holds

    def found(self, agent: Agent, history: History, cached: int) -> int:
        """How many of the first blocks of `history` the agent found cached rather than
        computed: of the full blocks its prompt reused (`cached` tokens), those before the first
        its own history computed."""
        own, found = set(agent.computed), 0
        for block_hash in history.block_hashes[: cached // self.prefix.block_tokens]:
            if block_hash in own:
                break
            found += 1
        return found

    def adopt(self, agent: Agent, history: History, found_blocks: int) -> None:
        """`history` becomes the agent's: its pages take their tiers, a pin holds them."""
        old_windows = self._window_keys(agent)
        self.registry.set_history(agent, history, found_blocks)
        for key, page in history_pages(self.prefix, agent):
            if self.registry.sharers(split_key(key)[0]) >= 2:
                self.pool.retier(page, TIER_SHARED)
        if agent.pinned:
            self.holds.hold(agent)
        self._let_go_of_passed(agent, old_windows - self._window_keys(agent))

    def idle(self, now: float, idle_s: float) -> None:
        """Move agents not heard from within `idle_s` to the idle tier, and with them the
        blocks of conversations without a name cached that long ago."""
        self.pool.demote_idle(idle_s)
        for agent in self.registry:
            if agent.working and now - agent.stats.last_used > idle_s:
                agent.working = False
                for _, page in history_pages(self.prefix, agent):
                    if self.pool.tier_of(page) == TIER_WORKING_AGENT:
                        self.pool.retier(page, TIER_IDLE_AGENT)

    def _let_go_of_passed(self, agent: Agent, passed: set[int]) -> None:
        """Sliding pages the agent's last history read and its new one does not (its window
        moved past them, or its tail grew into a new block): unless another agent's history
        still reads them, cached ones go to the out-of-window tier (reclaimed first, never
        written) and their files are deleted, so a history persisted at every turn keeps one
        window of sliding pages on disk as in memory. A page held by a running request is
        left to it; a write still queued lands later, for the disk budget to drop."""
        own = set(agent.hashes)  # its new history's: counted among the sharers
        shared = (
            self.registry.sharers(block) > (block in own) for block, _ in map(split_key, passed)
        )
        if any(shared):
            for other in self.registry:
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
