"""Pins: the pool pages each pinned agent holds so its next turn finds them in memory, and its
owner's bound on them (`max_pinned_share` of the pool).

Invariant: each page in `held` carries one pool reference taken here, released here when the
pin lets it go (to the working agents' tier, where any other cached page of an agent sits).
"""

from __future__ import annotations

from semantic.cache.pages.block_pool import TIER_WORKING_AGENT, BlockPool
from semantic.core import AgentKey


class Pins:
    def __init__(self, pool: BlockPool, max_share: float) -> None:
        self.pool = pool
        self.max_share = max_share
        self.held: dict[AgentKey, list[int]] = {}

    def fits(self, key: AgentKey, wanted: int) -> bool:
        """Whether the owner's pins, `wanted` pages for `key` in place of what it holds now,
        stay within `max_share` of the pool."""
        others = sum(
            len(pages) for k, pages in self.held.items() if k.owner == key.owner and k != key
        )
        return others + wanted <= self.max_share * self.pool.num_blocks

    def hold(self, key: AgentKey, pages: list[int]) -> None:
        """Hold `pages` for `key`, then let go of those it held before (taken first, so a page
        in both never leaves the pool between)."""
        for page in pages:
            self.pool.acquire(page)
        self.drop(key)
        self.held[key] = pages

    def drop(self, key: AgentKey) -> None:
        """Let go of the pages held for `key`, and forget it."""
        self.pool.release(self.held.pop(key, []), TIER_WORKING_AGENT)

    def let_go(self) -> int:
        """Let go of every pin's pages (each agent keeps its place, holding none until it is
        pinned again); returns how many were held."""
        held = sum(len(pages) for pages in self.held.values())
        for pages in self.held.values():
            self.pool.release(pages, TIER_WORKING_AGENT)
        self.held = {key: [] for key in self.held}
        return held
