"""Retention: the prefixes clients marked to be sent again (Anthropic `cache_control`
breakpoints, OpenAI `prompt_cache_retention`), kept for their time to live whoever else needs
the pool.

A retention names a prefix's full blocks by hash, with an expiry. It holds one pool reference
on each of their pages while its owner's retentions stay within `max_share` of the pool, as a
pin does, so no other request's eviction takes them; its block hashes are protected from the
disk budget, as a pinned agent's are, so a page let go of under pressure (`let_go`) is read
back instead of computed again. A request that reads a retained prefix from the cache renews
it (`renew`); once expired (`expire`) it lets go of everything and is forgotten. A key's
retentions name at most `max_tokens_per_key` tokens of distinct blocks: a request whose
breakpoints would pass that makes room by ending the key's retentions that end soonest, and
is refused before it runs only when its own breakpoints pass it (`make_room`), as a new agent
takes the place of its key's least recently used one.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from semantic.cache.pages.block_pool import TIER_ONE_OFF
from semantic.cache.pages.prefix import PrefixCache
from semantic.errors import RetentionLimit


@dataclass(slots=True)
class Retention:
    """One kept prefix: its full blocks' hashes (first to last), how long it lives after each
    use, when it ends, and the pool pages it holds a reference on (none once let go)."""

    owner: str | None
    hashes: tuple[int, ...]
    ttl_s: float
    expires_at: float
    pages: list[int] = field(default_factory=list)


class Retentions:
    """The live retentions of one model's cache.

    Invariants: a retention is known by its owner and its last block's hash (the chain hash
    names the whole prefix); each page in a retention's `pages` holds one pool reference, given
    back when it expires or is let go of; no owner's retentions name more than
    `max_tokens_per_key` tokens of distinct blocks, nor hold more than `max_share` of the pool's
    pages."""

    def __init__(
        self,
        prefix: PrefixCache,
        max_tokens_per_key: int,
        max_share: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.prefix = prefix
        self.pool = prefix.pool
        self.max_tokens_per_key = max_tokens_per_key
        self.max_share = max_share
        self._clock = clock
        self._kept: dict[tuple[str | None, int], Retention] = {}

    def __len__(self) -> int:
        return len(self._kept)

    def tokens(self, owner: str | None) -> int:
        """The tokens of distinct blocks `owner`'s retentions name."""
        return len(self._hashes_of(owner)) * self.prefix.block_tokens

    def protected(self) -> frozenset[int]:
        """The block hashes the disk budget must keep: every live retention's."""
        return frozenset(h for kept in self._kept.values() for h in kept.hashes)

    def make_room(self, owner: str | None, prefixes: Sequence[Sequence[int]]) -> int:
        """Make room in `owner`'s quota for keeping `prefixes` (block hashes each): expired
        retentions go first, then the owner's that end soonest, as many as it takes. Returns
        how many of the owner's live ones ended; RetentionLimit, and none ended, when
        `prefixes` alone pass the quota."""
        self.expire()
        wanted: set[int] = set().union(*prefixes)
        tokens = len(wanted) * self.prefix.block_tokens
        if tokens > self.max_tokens_per_key:
            raise RetentionLimit(
                f"the cache breakpoints of this request would keep {tokens} tokens, past the "
                f"{self.max_tokens_per_key} one API key may keep "
                "(max_retained_tokens_per_key): mark shorter prefixes"
            )
        soonest = sorted(
            (key for key, kept in self._kept.items() if kept.owner == owner),
            key=lambda key: self._kept[key].expires_at,
        )
        ended, size = 0, self.prefix.block_tokens
        while len(self._hashes_of(owner) | wanted) * size > self.max_tokens_per_key:
            self._release(self._kept.pop(soonest[ended]))
            ended += 1
        return ended

    def keep(self, owner: str | None, hashes: Sequence[int], ttl_s: float) -> Retention | None:
        """Keep a prefix at least `ttl_s` seconds from now (renewed, never shortened, when it
        is kept already); None for an empty one."""
        if not hashes:
            return None
        kept = self._kept.get((owner, hashes[-1]))
        now = self._clock()
        if kept is None:
            kept = Retention(owner, tuple(hashes), ttl_s, now + ttl_s)
            self._kept[owner, hashes[-1]] = kept
        kept.ttl_s = max(kept.ttl_s, ttl_s)
        kept.expires_at = max(kept.expires_at, now + ttl_s)
        self._hold(kept)
        return kept

    def renew(self, owner: str | None, read: Sequence[int]) -> int:
        """A request of `owner` read the blocks `read` from the cache: every retention of a
        prefix of them lives its time to live again from now, and takes its pages back.
        Returns how many were renewed."""
        renewed = 0
        for block_hash in read:
            kept = self._kept.get((owner, block_hash))
            if kept is not None and self._clock() < kept.expires_at:
                kept.expires_at = self._clock() + kept.ttl_s
                self._hold(kept)
                renewed += 1
        return renewed

    def expire(self, now: float | None = None) -> int:
        """Forget the retentions whose time is up, giving back their pages; how many."""
        now = self._clock() if now is None else now
        ended = [key for key, kept in self._kept.items() if kept.expires_at <= now]
        for key in ended:
            self._release(self._kept.pop(key))
        return len(ended)

    def summary(self, seen: Callable[[str | None], bool]) -> dict[str, int]:
        """What the retentions of the owners `seen` keep: how many, their tokens (distinct
        blocks, as the quota counts them) and the pool pages they hold."""
        mine = [kept for kept in self._kept.values() if seen(kept.owner)]
        hashes = {h for kept in mine for h in kept.hashes}
        return {
            "retentions": len(mine),
            "tokens": len(hashes) * self.prefix.block_tokens,
            "pages_held": len({page for kept in mine for page in kept.pages}),
        }

    def next_expiry_in(self) -> float | None:
        """Seconds until the first live retention ends (None: there is none)."""
        ends = [kept.expires_at for kept in self._kept.values()]
        return max(0.0, min(ends) - self._clock()) if ends else None

    def let_go(self) -> int:
        """Give back every page retentions hold (a request that nothing else stands in the way
        of must run); their files stay protected, and a renewal takes the pages back. Returns
        how many were held."""
        held = 0
        for kept in self._kept.values():
            held += len(kept.pages)
            self._release(kept)
        return held

    def _hold(self, kept: Retention) -> None:
        """Hold the pages of `kept`'s blocks that are in the pool, in place of those it held,
        unless that would take its owner past `max_share` of the pool (then its blocks are
        kept by their files alone)."""
        self._release(kept)
        num_tokens = len(kept.hashes) * self.prefix.block_tokens
        pages = [page for _, page in self.prefix.history_pages(kept.hashes, num_tokens)]
        others = {p for k in self._kept.values() if k.owner == kept.owner for p in k.pages}
        if len(others.union(pages)) > self.max_share * self.pool.num_blocks:
            return
        for page in pages:
            self.pool.acquire(page)
        kept.pages = pages

    def _release(self, kept: Retention) -> None:
        self.pool.release(kept.pages, TIER_ONE_OFF)
        kept.pages = []

    def _hashes_of(self, owner: str | None) -> set[int]:
        return {h for kept in self._kept.values() if kept.owner == owner for h in kept.hashes}
