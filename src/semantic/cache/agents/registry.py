"""The registry of one model's agents: which agents there are, by key; how many each owner
keeps and how much conversation text (`ConversationQuota`); which blocks their histories name,
and by how many agents; and which agent each request in flight began on.

It keeps these counts in step with its agents and decides nothing: room-making under the
limits is `lifecycle.py`'s, the tiers of history pages `histories.py`'s, the manifests
`records.py`'s. On the engine thread, except `get` (and the quota, which has its own lock):
`records.py` reads it on any thread under its manifest lock.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

from semantic.cache.agents.agent import Agent
from semantic.cache.agents.conversation import Conversation
from semantic.cache.agents.conversation_quota import ConversationQuota
from semantic.core import AgentKey, History
from semantic.errors import NotFound


class AgentRegistry:
    """Invariants: `_per_owner[o]` counts the agents of owner `o`; `_sharers[h]` counts the
    agents whose history contains block `h` (two or more puts it in the shared tier); `quota`
    counts the conversation text each owner's agents hold, a value that forks share counted
    once; `_began` maps each request in flight that names an agent to the agent it began on,
    so a request whose agent was deleted meanwhile never brings it back."""

    def __init__(self, max_conversation_bytes_per_key: int) -> None:
        self.by_key: dict[AgentKey, Agent] = {}
        self.quota = ConversationQuota(max_conversation_bytes_per_key)
        self._per_owner: Counter[str | None] = Counter()
        self._sharers: Counter[int] = Counter()
        self._began: dict[str, Agent] = {}

    def __iter__(self) -> Iterator[Agent]:
        return iter(self.by_key.values())

    def get(self, key: AgentKey) -> Agent | None:
        return self.by_key.get(key)

    def known(self, key: AgentKey) -> Agent:
        """The agent of `key`; NotFound when there is none."""
        agent = self.by_key.get(key)
        if agent is None:
            raise NotFound(f"no agent {key.agent_id!r}")
        return agent

    def holds(self, agent: Agent) -> bool:
        """Whether `agent` is the one registered under its key (not deleted, nor replaced by
        another of the same id since)."""
        return self.by_key.get(agent.key) is agent

    def count(self, owner: str | None) -> int:
        return self._per_owner[owner]

    def add(self, agent: Agent) -> Agent:
        """Register `agent` with what it holds: its conversation, the blocks it names."""
        self.by_key[agent.key] = agent
        self._per_owner[agent.owner] += 1
        self.quota.swap(agent.owner, None, agent.conversation)
        self._sharers.update(agent.hashes)
        return agent

    def remove(self, agent: Agent) -> None:
        """Let go of `agent` and of what it held; its blocks stay where they are."""
        del self.by_key[agent.key]
        self._per_owner[agent.owner] -= 1
        self.quota.swap(agent.owner, agent.conversation, None)
        self._sharers -= Counter(agent.hashes)  # `-=` drops hashes no agent shares any more

    def keep_conversation(self, agent: Agent, conversation: Conversation | None) -> None:
        """`conversation` becomes the agent's, counted in its owner's quota in place of its
        last."""
        self.quota.swap(agent.owner, agent.conversation, conversation)
        agent.conversation = conversation

    def set_history(self, agent: Agent, history: History, found_blocks: int) -> None:
        """`history` becomes the agent's, the first `found_blocks` of it found cached."""
        old = set(agent.hashes)
        agent.block_hashes, agent.tail_hash = history.block_hashes, history.tail_hash
        agent.num_tokens, agent.found_blocks = history.num_tokens, found_blocks
        new = set(agent.hashes)
        self._sharers.update(new - old)
        self._sharers -= Counter(old - new)

    def sharers(self, block_hash: int) -> int:
        """How many agents' histories name the block."""
        return self._sharers[block_hash]

    def names(self, block_hash: int) -> bool:
        """Whether an agent's history names a block (its pages' tiers are then the agents'
        to decide: `histories.py`)."""
        return self._sharers[block_hash] > 0

    def began(self, request_id: str, agent: Agent) -> None:
        """A request naming `agent` is in flight."""
        self._began[request_id] = agent

    def began_on(self, request_id: str) -> Agent | None:
        """The agent the request in flight began on, if it named one."""
        return self._began.get(request_id)

    def ended(self, request_id: str) -> Agent | None:
        """The request is no longer in flight: the agent it began on, if it named one."""
        return self._began.pop(request_id, None)

    def running(self) -> set[AgentKey]:
        """The agents that a request in flight names."""
        return {agent.key for agent in self._began.values()}

    def census(self) -> tuple[int, int]:
        """(agents active within `idle_s`, agents idle)."""
        active = sum(agent.working for agent in self.by_key.values())
        return active, len(self.by_key) - active
