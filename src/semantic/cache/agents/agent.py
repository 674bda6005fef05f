"""An agent: its key, the blocks of its last history, whether it is pinned or working, its
statistics, and the conversation the direct agent API keeps for it."""

from __future__ import annotations

from dataclasses import dataclass, field

from semantic.cache.agents.conversation import Conversation
from semantic.cache.agents.stats import AgentStats
from semantic.cache.pages.prefix import PrefixCache
from semantic.core import AgentKey


@dataclass(slots=True)
class Agent:
    key: AgentKey
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
    # How many of `block_hashes`, from the first, it found cached rather than computed (another
    # conversation's, a system prompt others use): `Lifecycle.delete` leaves them to their users.
    found_blocks: int = 0

    @property
    def agent_id(self) -> str:
        return self.key.agent_id

    @property
    def owner(self) -> str | None:
        return self.key.owner

    @property
    def hashes(self) -> list[int]:
        return [*self.block_hashes, *([self.tail_hash] if self.tail_hash is not None else [])]

    @property
    def computed(self) -> list[int]:
        """The blocks of its history it computed itself: all but those it found cached."""
        return self.hashes[self.found_blocks :]


def history_pages(prefix: PrefixCache, agent: Agent) -> list[tuple[int, int]]:
    """(key, page) of the pool pages the agent's next turn reads."""
    return prefix.history_pages(agent.hashes, agent.num_tokens)
