"""Named agents' lifecycle: created (by the agent API, or on a chat request's first sight of a
name) within its owner's limits, making room by forgetting the least recently used agents that
nothing needs; forked; held by one generate call at a time; deleted, taking the blocks only it
computed with it.

On the engine thread, one call at a time: of two creates of one id exactly one wins.
"""

from __future__ import annotations

import logging
import time

from semantic.cache.agents.agent import Agent
from semantic.cache.agents.conversation import Conversation
from semantic.cache.agents.histories import Histories
from semantic.cache.agents.holds import Holds
from semantic.cache.agents.records import AgentRecords
from semantic.cache.agents.registry import AgentRegistry
from semantic.cache.disk.tiering import Tiering
from semantic.cache.pages.prefix import PrefixCache
from semantic.core import AgentKey, History
from semantic.errors import Conflict, ConversationTooLarge, TooManyAgents
from semantic.settings.options import AgentOptions

log = logging.getLogger(__name__)


class Lifecycle:
    """Invariants: each owner keeps at most `options.max_per_key` agents, and at most
    `options.max_conversation_bytes_per_key` of conversation text (`registry.quota`); an agent
    is held by at most one generate call (`turn`)."""

    def __init__(
        self,
        prefix: PrefixCache,
        tiering: Tiering,
        registry: AgentRegistry,
        records: AgentRecords,
        holds: Holds,
        histories: Histories,
        options: AgentOptions,
    ) -> None:
        self.prefix = prefix
        self.tiering = tiering
        self.registry = registry
        self.records = records
        self.holds = holds
        self.histories = histories
        self.options = options

    def add(self, agent: Agent) -> Agent:
        """A new agent in its owner's scope, making room for it (`_make_room`) first."""
        self._make_room(agent.owner)
        return self.registry.add(agent)

    def create(self, key: AgentKey, conversation: Conversation) -> Agent:
        """A new agent with a conversation and nothing cached yet; Conflict if the id is taken
        in its owner's scope, ConversationTooLarge, ConversationQuotaExceeded or TooManyAgents
        past the limits. The caller then writes its manifest with `AgentRecords.save`."""
        if self.registry.get(key) is not None:
            raise Conflict(f"agent {key.agent_id!r} already exists")
        self.check_size(conversation)
        self.registry.quota.check(key.owner, conversation)
        agent = self.add(Agent(key, conversation=conversation))
        agent.stats.last_used = time.time()
        return agent

    def fork(self, parent_key: AgentKey, child_key: AgentKey) -> Agent:
        """A new agent holding the parent's conversation (the same value, not a copy: its
        manifest names the same file, and its owner's quota counts it once) whose cache is the
        parent's: the same blocks by hash, in memory or on disk, so the fork costs no block.
        Either side extending the shared partial tail copies it first (the scheduler's
        copy-on-write); deleting one keeps every block, and the conversation, the other still
        names."""
        parent = self.registry.known(parent_key)
        child = self.create(child_key, parent.conversation or Conversation())
        history = History(list(parent.block_hashes), parent.tail_hash, parent.num_tokens)
        self.histories.adopt(child, history, parent.found_blocks)
        return child

    def begin_turn(self, key: AgentKey, turn_id: str, message: str) -> tuple[Agent, Conversation]:
        """Hold the agent for one generate call of `message` and return it with its
        conversation so far; NotFound, Conflict while another call holds it, or
        ConversationTooLarge when the conversation and the message are past the limit."""
        agent = self.registry.known(key)
        if agent.turn is not None:
            raise Conflict(f"agent {key.agent_id!r} is already generating")
        conversation = agent.conversation or Conversation()
        longer = conversation.with_turn(message, "")
        self.check_size(longer)
        self.registry.quota.check(key.owner, longer, agent.conversation)
        agent.turn = turn_id
        return agent, conversation

    def end_turn(self, key: AgentKey, turn_id: str) -> bool:
        """Release the agent held by `turn_id`. False when that turn no longer holds it (it was
        ended already: releasing twice never frees a later turn's hold)."""
        agent = self.registry.get(key)
        if agent is None or agent.turn != turn_id:
            return False
        agent.turn = None
        return True

    def check_size(self, conversation: Conversation) -> None:
        limit = self.options.max_conversation_bytes
        if conversation.text_bytes() > limit:
            raise ConversationTooLarge(
                f"the conversation would hold {conversation.text_bytes()} bytes of text; an "
                f"agent keeps at most {limit} (max_conversation_mb): fork from an earlier "
                "agent or start a new one",
                param="message",
            )

    def delete(self, key: AgentKey) -> bool:
        """Forget an agent: its manifest (conversation included), and the blocks it computed
        that no other agent uses, in memory (cached ones; a block a running request holds stays
        until it finishes) and on disk: deleting an agent is how a client has the server forget
        a conversation. Blocks it found cached (its owner's other requests', such as a system
        prompt they share) stay theirs. Conflict while a generate call holds it."""
        agent = self.registry.get(key)
        if agent is None:
            return False
        if agent.turn is not None:
            raise Conflict(f"agent {key.agent_id!r} is generating; delete it once the call ends")
        self._forget(agent)
        gone = [
            page_key
            for block_hash in agent.computed
            if self.registry.sharers(block_hash) <= 0
            for page_key in self.prefix.keys(block_hash)
        ]
        for page_key in gone:
            self.prefix.discard(page_key)
        # A write queued before now (behind its last turn, or an eviction) lands later: the
        # files are deleted again behind it, and count as gone meanwhile.
        self.tiering.delete_behind(gone)
        return True

    def withdraw(self, agent: Agent) -> None:
        """Undo the creation of `agent`, whose manifest could not be written: deleted, unless
        it was deleted (and perhaps created again) meanwhile."""
        if self.registry.holds(agent) and agent.turn is None:
            self.delete(agent.key)

    def _make_room(self, owner: str | None) -> None:
        """At `max_per_key`, the owner's least recently used agents that nothing needs (no
        conversation, not pinned, no turn, no request running) are forgotten, as many as it
        takes to make room for one (more than one when the limit was lowered since the
        manifests were written): their names go, their blocks stay as cache. TooManyAgents,
        and none forgotten, when too few may go."""
        limit = self.options.max_per_key
        excess = self.registry.count(owner) - limit + 1
        if excess <= 0:
            return
        running = self.registry.running()
        spare = [
            a
            for a in self.registry
            if a.owner == owner
            and a.conversation is None
            and not a.pinned
            and a.turn is None
            and a.key not in running
        ]
        if len(spare) < excess:
            raise TooManyAgents(
                f"this API key has {limit} agents, the most it may keep (max_agents_per_key), "
                "and each has a conversation, a pin or a request running: delete some "
                "(DELETE /v1/agents/{agent_id})"
            )
        for oldest in sorted(spare, key=lambda agent: agent.stats.last_used)[:excess]:
            log.info("agent %s forgotten to make room for a new one", oldest.agent_id)
            self._forget(oldest)

    def _forget(self, agent: Agent) -> None:
        """The agent's name, manifest and pins go; its blocks stay where they are. The
        manifest goes first: when it cannot be removed, PersistFailed, and the agent stays
        as it was (else it would come back at the next start, its pins leaked meanwhile)."""
        self.records.remove(agent)
        self.holds.drop(agent)
