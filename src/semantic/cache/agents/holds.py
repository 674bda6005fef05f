"""Holds: what clients asked the cache to keep, pinned agents (`pins.py`) and retained prefixes
(`retention.py`), together. Their pages are held in the pool within `max_pinned_share` of it,
and their block hashes are protected from the disk budget, so a page let go of under pressure
(`let_go`) is read back instead of computed again.

On the engine thread.
"""

from __future__ import annotations

import logging

from semantic.cache.agents.agent import Agent, history_pages
from semantic.cache.agents.pins import Pins
from semantic.cache.agents.registry import AgentRegistry
from semantic.cache.agents.retention import Retentions
from semantic.cache.disk.tiering import Tiering
from semantic.cache.pages.prefix import PrefixCache
from semantic.core import History, Request
from semantic.errors import PinLimit
from semantic.settings.options import AgentOptions

log = logging.getLogger(__name__)


class Holds:
    """Invariants: a pinned agent's hot blocks hold one pin reference each (`pins`), a live
    retention's its own (`retentions`); `tiering.protected` is the hashes of every pinned
    agent's history and every live retention's prefix."""

    def __init__(
        self,
        prefix: PrefixCache,
        tiering: Tiering,
        registry: AgentRegistry,
        options: AgentOptions,
    ) -> None:
        self.prefix = prefix
        self.tiering = tiering
        self.registry = registry
        self.max_share = options.max_pinned_share
        self.pins = Pins(prefix.pool, options.max_pinned_share)
        # Prefixes clients marked to be sent again; they hold pages within the pins' share.
        self.retentions = Retentions(
            prefix, options.max_retained_tokens_per_key, options.max_pinned_share
        )

    # -- pins -------------------------------------------------------------------------------

    def pin(self, agent: Agent, pinned: bool = True) -> None:
        """A pinned agent's hot blocks stay in memory, and its files on the disk (PinLimit when
        its owner's pins would hold more of the pool than `max_pinned_share`)."""
        if pinned and not self._fits(agent):
            raise PinLimit(
                f"pinning agent {agent.agent_id!r} would hold more than "
                f"{self.max_share:.0%} of the KV pool for this key's pins; "
                "unpin another agent first"
            )
        agent.pinned = pinned
        if pinned:
            self.hold(agent)
        else:
            self.pins.drop(agent.key)
        self.protect()

    def hold(self, agent: Agent) -> None:
        """Hold the pages the agent's next turn reads, and let go of those held for its last
        history (those its window moved past then leave as out of the window:
        `Histories.adopt`). A history grown past its owner's share is held by its files
        alone, until the agent is pinned again."""
        fits = self._fits(agent)
        pages = [page for _, page in history_pages(self.prefix, agent)] if fits else []
        self.pins.hold(agent.key, pages)

    def drop(self, agent: Agent) -> None:
        """The agent is forgotten: its pin, if any, goes."""
        self.pins.drop(agent.key)
        if agent.pinned:
            self.protect()

    def _fits(self, agent: Agent) -> bool:
        """Whether the owner's pins, this agent's history in place of what it holds now, stay
        within `max_pinned_share` of the pool."""
        return self.pins.fits(agent.key, len(history_pages(self.prefix, agent)))

    # -- retentions -------------------------------------------------------------------------

    def make_room(self, request: Request) -> None:
        """A request arrived: its breakpoints must fit its owner's retention quota, its older
        retentions making room (RetentionLimit when they alone do not fit)."""
        if not request.breakpoints:
            return
        root = self.prefix.root_of(request.owner)
        prompt = request.prompt_token_ids
        prefixes = [self.prefix.chain(prompt[: p.num_tokens], root) for p in request.breakpoints]
        if self.retentions.make_room(request.owner, prefixes):
            self.protect()

    def retain(self, request: Request, history: History, cached: int) -> tuple[int, ...]:
        """After a request: the retained prefixes it read from the cache are renewed, and each
        of its breakpoints keeps the full blocks of its prefix that it left cached. Returns the
        tokens each breakpoint keeps."""
        size, owner = self.prefix.block_tokens, request.owner
        renewed = self.retentions.renew(owner, history.block_hashes[: cached // size])
        kept = []
        for point in request.breakpoints:
            hashes = history.block_hashes[: point.num_tokens // size]
            held = self.retentions.keep(owner, hashes, point.ttl_s)
            kept.append(0 if held is None else len(hashes) * size)
        if kept or renewed:
            self.protect()
        return tuple(kept)

    def expire(self) -> None:
        """Forget the retentions whose time is up."""
        if self.retentions.expire():
            self.protect()

    # -- both -------------------------------------------------------------------------------

    def protect(self) -> None:
        """The disk budget never drops the files of a pinned agent, nor a live retention's."""
        pinned = frozenset(h for a in self.registry if a.pinned for h in a.hashes)
        self.tiering.protected = pinned | self.retentions.protected()

    def let_go(self) -> int:
        """Release every pin's pages to the working agents' tier, and every retention's (their
        files stay on disk, where pins and retentions keep them): a request that nothing else
        stands in the way of must run, and a pin takes its pages back at its agent's next turn
        (a retention at its next use). Returns how many were held."""
        held = self.pins.let_go() + self.retentions.let_go()
        if held:
            log.info("pins let go of %d pages for a request that could not run beside them", held)
        return held
