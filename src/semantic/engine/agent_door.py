"""The API's one way to agents: every call names its caller, and which agents a caller may see
and touch is decided here and nowhere else.

A caller's agents are those of its owner scope (`Caller.owner`: a digest of its API key, None
on a server without keys); an admin sees every owner's, and names another owner's agent with
`owner`. An agent the caller may not see does not exist for it: 404, as for an unknown one.
Reads and changes of agents run on the engine thread (`Engine.call`); manifest writes run off
it, and a change whose manifest could not be written is undone before the error goes out, so
nothing is acknowledged that the disk does not have.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from semantic.cache.agents.agent import Agent
from semantic.cache.agents.conversation import Conversation
from semantic.cache.agents.manifest import UNOWNED
from semantic.cache.agents.persist import EvictResult, PersistResult
from semantic.core import AgentKey, Caller
from semantic.errors import Conflict, NotFound, PersistFailed

if TYPE_CHECKING:  # the engine builds its door
    from semantic.engine.engine import Engine


@dataclass(slots=True, frozen=True)
class AgentPage:
    """One page of a caller's agents, in id order, as `Agents.describe` shows each."""

    data: list[dict[str, Any]]
    has_more: bool


@dataclass(slots=True, frozen=True)
class TurnHold:
    """A generate call's hold on its agent, named before it is taken (`AgentDoor.hold`), so
    that a call cancelled while taking it can still let it go."""

    key: AgentKey
    turn_id: str


class AgentDoor:
    """What the API may do with agents, each for a caller.

    `owner` arguments name the scope an admin means (`none` for agents without an owner);
    for anyone else, an owner other than their own finds nothing.
    """

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._agents = engine.agents

    # -- reading ----------------------------------------------------------------------------

    async def page(
        self, caller: Caller, limit: int, after: str | None = None, owner: str | None = None
    ) -> AgentPage:
        """Up to `limit` of the caller's agents (an admin's: every owner's, or `owner`'s; for
        anyone else `owner` only filters their own) whose ids come after `after`. Agents of
        one id (an admin sees each owner's) never straddle two pages, so a page may hold a few
        more than `limit`."""
        scopes = None if owner is None else {_named_scope(owner)}

        def read() -> AgentPage:
            seen = [
                a
                for a in self._agents.by_key.values()
                if _sees(caller, a) and (scopes is None or a.owner in scopes)
            ]
            later = sorted(
                (a for a in seen if after is None or a.agent_id > after), key=_listing_order
            )
            cut = len(later)
            if len(later) > limit:
                last = later[limit - 1].agent_id
                rest = range(limit, len(later))
                cut = next((i for i in rest if later[i].agent_id != last), len(later))
            return AgentPage([self._agents.describe(a) for a in later[:cut]], cut < len(later))

        return await self._engine.call(read)

    async def describe(
        self, caller: Caller, agent_id: str, owner: str | None = None
    ) -> dict[str, Any]:
        key = self._key(caller, agent_id, owner)
        return await self._engine.call(lambda: self._agents.describe(self._find(key)))

    async def conversation(
        self, caller: Caller, agent_id: str, owner: str | None = None
    ) -> Conversation:
        """The conversation the agent API keeps for the agent (empty for one only chat
        requests named)."""
        key = self._key(caller, agent_id, owner)
        return await self._engine.call(lambda: self._find(key).conversation or Conversation())

    async def snapshot(self, caller: Caller) -> dict[str, Any]:
        """Cache totals, every agent the caller may see, the last misses of the requests whose
        owner it may see (where and why, never what the prompt said), and what those owners'
        cache breakpoints keep (`/admin/cache`)."""

        def read() -> dict[str, Any]:
            seen = sorted(
                (a for a in self._agents.by_key.values() if _sees(caller, a)), key=_listing_order
            )
            agents = [self._agents.describe(a) for a in seen]
            misses = self._agents.misses.seen_by(lambda owner: _reaches(caller, owner))
            kept = self._agents.retentions.summary(lambda owner: _reaches(caller, owner))
            return {
                "totals": self._agents.stats.totals(),
                "agents": agents,
                "recent_misses": misses,
                "breakpoints": kept,
            }

        return await self._engine.call(read)

    # -- creating and changing --------------------------------------------------------------

    async def create(
        self, caller: Caller, agent_id: str, conversation: Conversation
    ) -> dict[str, Any]:
        """A new agent of the caller's, durable before it is acknowledged: Conflict for an id
        the caller has, TooManyAgents or ConversationTooLarge past the limits, PersistFailed
        (and no agent) when its manifest could not be written."""
        key = AgentKey(agent_id, caller.owner)
        return await self._created(lambda: self._agents.create(key, conversation))

    async def fork(
        self, caller: Caller, parent_id: str, child_id: str, owner: str | None = None
    ) -> dict[str, Any]:
        """A new agent of the caller's (an admin's too, forking another owner's agent) sharing
        the parent's conversation and cache; durable as `create`."""
        parent, child = self._key(caller, parent_id, owner), AgentKey(child_id, caller.owner)
        return await self._created(lambda: self._agents.fork(parent, child))

    async def pin(
        self, caller: Caller, agent_id: str, pinned: bool, owner: str | None = None
    ) -> dict[str, Any]:
        """Pin or unpin the agent, durably: when its manifest cannot be written, the pin goes
        back to what it was and PersistFailed says so. NotFound for an unknown agent."""
        key = self._key(caller, agent_id, owner)

        def apply() -> tuple[Agent, bool]:
            agent = self._find(key)
            before = agent.pinned
            self._agents.pin(key, pinned)
            return agent, before

        agent, before = await self._engine.call(apply)
        try:
            await self._save(agent)
        except PersistFailed:
            await self._engine.call(lambda: self._agents.pin(key, before))
            raise
        return await self._engine.call(lambda: self._agents.describe(agent))

    async def delete(self, caller: Caller, agent_id: str, owner: str | None = None) -> None:
        """NotFound for an unknown agent, Conflict while a turn holds it, PersistFailed (and
        the agent as it was) when its manifest could not be removed."""
        key = self._key(caller, agent_id, owner)
        if not await self._engine.call(lambda: self._agents.delete(key)):
            raise NotFound(f"no agent {agent_id!r}")

    async def persist(
        self, caller: Caller, agent_id: str, owner: str | None = None
    ) -> PersistResult:
        """Write the agent's cache and manifest; NotFound for an unknown agent."""
        key = self._key(caller, agent_id, owner)
        await self._engine.call(lambda: self._find(key))
        return await self._engine.persist([key])

    async def persist_many(
        self, caller: Caller, agent_ids: list[str] | None, owner: str | None = None
    ) -> PersistResult:
        """Persist the named agents of the caller's scope (or `owner`'s), or every cache when
        none are named (an admin route). Names of agents the caller cannot see name none, as
        unknown ids do: never a 404 here."""
        return await self._engine.persist(self._keys(caller, agent_ids, owner))

    async def evict_many(
        self, caller: Caller, agent_ids: list[str] | None, owner: str | None = None
    ) -> EvictResult:
        """As `persist_many`, then free the blocks that made it to disk."""
        return await self._engine.evict(self._keys(caller, agent_ids, owner))

    # -- turns of the agent API -------------------------------------------------------------

    def hold(
        self, caller: Caller, agent_id: str, turn_id: str, owner: str | None = None
    ) -> TurnHold:
        """Name the hold a generate call will take (NotFound for a scope the caller may not
        reach); `begin_turn` takes it."""
        return TurnHold(self._key(caller, agent_id, owner), turn_id)

    async def begin_turn(self, hold: TurnHold, message: str) -> Conversation:
        """Take the hold for one generate call of `message` and return the conversation so
        far: NotFound, Conflict while another call holds the agent, ConversationTooLarge past
        the limit."""
        return await self._engine.call(
            lambda: self._agents.begin_turn(hold.key, hold.turn_id, message)[1]
        )

    async def commit_turn(self, hold: TurnHold, conversation: Conversation) -> None:
        """Make `conversation` the agent's, on disk first, then release the hold. When the
        write fails the conversation stays as it was (PersistFailed), and the hold is
        released all the same (posted: the engine thread takes messages in order, so the
        agent's next call, sent after this answer, finds it released)."""
        try:
            agent = await self._engine.call(lambda: self._held(hold))
            await self._save(agent, conversation)
        finally:
            self.release_turn(hold)

    def release_turn(self, hold: TurnHold) -> None:
        """Let the agent go without changing it. Never waits: safe from a finalizer."""
        self._engine.post(lambda: self._agents.end_turn(hold.key, hold.turn_id))

    # -- inside -----------------------------------------------------------------------------

    async def _created(self, create: Callable[[], Agent]) -> dict[str, Any]:
        """Run `create` on the engine thread, then write the new agent's manifest off it, so
        it survives a restart from the moment it is acknowledged; when the write fails, the
        agent is withdrawn and PersistFailed goes out."""

        def create_and_describe() -> tuple[Agent, dict[str, Any]]:
            agent = create()
            return agent, self._agents.describe(agent)

        agent, described = await self._engine.call(create_and_describe)
        try:
            await self._save(agent)
        except PersistFailed:
            await self._engine.call(lambda: self._agents.withdraw(agent))
            raise
        return described

    async def _save(self, agent: Agent, conversation: Conversation | None = None) -> None:
        await asyncio.to_thread(self._agents.save_manifest, agent, conversation)

    def _held(self, hold: TurnHold) -> Agent:
        """On the engine thread: the agent `hold` holds (Conflict if it lost it)."""
        agent = self._find(hold.key)
        if agent.turn != hold.turn_id:
            raise Conflict(f"agent {hold.key.agent_id!r} is no longer held by this call")
        return agent

    def _find(self, key: AgentKey) -> Agent:
        """On the engine thread: the agent, or NotFound."""
        agent = self._agents.get(key)
        if agent is None:
            raise NotFound(f"no agent {key.agent_id!r}")
        return agent

    def _key(self, caller: Caller, agent_id: str, owner: str | None) -> AgentKey:
        scope = caller.owner if owner is None else self._scope(caller, owner)
        return AgentKey(agent_id, scope)

    def _keys(
        self, caller: Caller, agent_ids: list[str] | None, owner: str | None
    ) -> list[AgentKey] | None:
        if agent_ids is None:
            return None
        if owner is not None and not _reaches(caller, _named_scope(owner)):
            return []
        return [self._key(caller, agent_id, owner) for agent_id in agent_ids]

    @staticmethod
    def _scope(caller: Caller, owner: str) -> str | None:
        """The owner scope `owner` names, if the caller may reach it (else NotFound)."""
        scope = _named_scope(owner)
        if not _reaches(caller, scope):
            raise NotFound(f"no agents of owner {owner[:40]!r}")
        return scope


def _named_scope(owner: str) -> str | None:
    """The scope an `owner` argument names: `none` is the agents of no owner."""
    return None if owner == UNOWNED else owner


def _sees(caller: Caller, agent: Agent) -> bool:
    return _reaches(caller, agent.owner)


def _reaches(caller: Caller, scope: str | None) -> bool:
    """Whether the caller may see the agents of owner scope `scope`."""
    return caller.admin or scope == caller.owner


def _listing_order(agent: Agent) -> tuple[str, str]:
    return agent.agent_id, agent.owner or ""
