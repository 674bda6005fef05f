"""Agents: whose history is which blocks, what that means for eviction (shared, working, idle,
pinned), the direct agent API's conversations and turns, how many agents an owner keeps, and
persistence of agents. The agent itself is `agent.py`; the pages pins hold, `pins.py`; waiting
for a persist and its result, `persist.py`.

Agents are keyed by `AgentKey`: an id within its owner's scope. Who may see which agent is not
decided here but in `engine/agent_door.py`, the API's one way in.

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
from pathlib import Path
from typing import Any

from semantic.cache.agents.agent import Agent
from semantic.cache.agents.conversation import Conversation
from semantic.cache.agents.conversation_quota import ConversationQuota
from semantic.cache.agents.manifest import AgentManifest, ManifestFiles
from semantic.cache.agents.misses import Lookup, MissRecord, RecentMisses, diagnose
from semantic.cache.agents.persist import PendingPersist, PersistResult
from semantic.cache.agents.pins import Pins
from semantic.cache.agents.retention import Retentions
from semantic.cache.agents.stats import CacheStats, Served
from semantic.cache.disk.tiering import Tiering
from semantic.cache.pages.block_pool import (
    TIER_IDLE_AGENT,
    TIER_OUT_OF_WINDOW,
    TIER_SHARED,
    TIER_WORKING_AGENT,
    BlockPool,
)
from semantic.cache.pages.prefix import PrefixCache, PrefixMatch, split_key
from semantic.core import AgentKey, CacheMiss, History, Request
from semantic.errors import (
    Conflict,
    ConversationTooLarge,
    NotFound,
    PersistFailed,
    PinLimit,
    TooManyAgents,
)
from semantic.settings.options import AgentOptions

log = logging.getLogger(__name__)


class Agents:
    """The agents of one model's cache, named ones with their histories, and the statistics of
    every request.

    Invariants: an agent's `hashes` name its last history, the first `found_blocks` of them
    found cached (not computed by it); `_sharers[h]` counts the agents whose
    history contains `h` (two or more puts the block in the shared tier); a pinned agent's hot
    blocks hold one pin reference each; an agent is held by at most one generate call (`turn`);
    `_per_owner` counts each owner's agents, at most `options.max_per_key` each; `_began` maps
    each request in flight that names an agent to the agent it began on, so a request whose
    agent was deleted meanwhile never brings it back; `quota` counts the conversation text each
    owner's agents hold, at most `options.max_conversation_bytes_per_key`, a value that forks
    share counted once. Manifests are written on `persist`, at shutdown, and behind each turn
    once the blocks it names are on disk (`cache/agents/write_behind.py`); an agent with a
    conversation (the agent API) has its own written at each turn too, a few bytes that cannot
    be computed again. Blocks need no
    manifest to be found: a prompt walks its chain in memory and on disk alike
    (`cache/pages/prefix.py`).
    """

    def __init__(
        self,
        prefix: PrefixCache,
        tiering: Tiering,
        manifests: ManifestFiles,
        options: AgentOptions,
    ) -> None:
        self.prefix = prefix
        self.pool: BlockPool = prefix.pool
        self.tiering = tiering
        self.manifests = manifests
        self.options = options
        self.stats = CacheStats(tiering)
        self.misses = RecentMisses()
        self.by_key: dict[AgentKey, Agent] = {}
        self._per_owner: Counter[str | None] = Counter()
        self._sharers: Counter[int] = Counter()
        self.pins = Pins(self.pool, options.max_pinned_share)
        self._began: dict[str, Agent] = {}
        self.quota = ConversationQuota(options.max_conversation_bytes_per_key)
        # Prefixes clients marked to be sent again; they hold pages within the pins' share.
        self.retentions = Retentions(
            prefix, options.max_retained_tokens_per_key, options.max_pinned_share
        )
        # Held while a manifest is written or deleted: a write that lost the race with a delete
        # must not bring the agent back.
        self.manifest_lock = threading.Lock()
        self._next_sweep = 0.0
        for manifest in manifests.load_all():
            self._remember(manifest)

    @property
    def model_root(self) -> Path:
        return self.manifests.model_root

    def get(self, key: AgentKey) -> Agent | None:
        return self.by_key.get(key)

    # -- on the engine thread ---------------------------------------------------------------

    def begin(self, request: Request) -> None:
        """A request arrived: its breakpoints must fit its owner's retention quota, its
        older retentions making room (RetentionLimit when they alone do not fit), and an agent
        it names is created on first sight, within its owner's limit (TooManyAgents past it)."""
        if request.breakpoints:
            root = self.prefix.root_of(request.owner)
            prompt = request.prompt_token_ids
            points = request.breakpoints
            prefixes = [self.prefix.chain(prompt[: p.num_tokens], root) for p in points]
            if self.retentions.make_room(request.owner, prefixes):
                self._protect_pinned()
        key = request.agent
        if key is None:
            return
        agent = self.by_key.get(key)
        if agent is None:
            agent = self._add(Agent(key))
        self._began[request.request_id] = agent
        agent.working = True
        agent.stats.last_used = time.time()

    def why_missed(self, request: Request, match: PrefixMatch, root: int) -> CacheMiss | None:
        """Where and why the prompt of a request that `begin` saw missed the cache, as `match`
        (in the chain from `root`) found it on arrival: against its agent's last history, if
        it names one that has a history here."""
        agent, key = self._began.get(request.request_id), request.agent
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
        self._began.pop(request.request_id, None)

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
        began = self._began.pop(request.request_id, None)
        agent = began if began is not None and self.by_key.get(began.key) is began else None
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
            self._set_history(agent, history, self._found(agent, history, cached))
            return agent
        return None

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
            self._protect_pinned()
        return tuple(kept)

    def names(self, block_hash: int) -> bool:
        """Whether an agent's history names a block (its pages' tiers are then this class's to
        decide: `_let_go_of_passed`)."""
        return self._sharers[block_hash] > 0

    def _found(self, agent: Agent, history: History, cached: int) -> int:
        """How many of the first blocks of `history` the agent found cached rather than
        computed: of the full blocks its prompt reused (`cached` tokens), those before the first
        its own history computed."""
        own, found = set(agent.computed), 0
        for block_hash in history.block_hashes[: cached // self.prefix.block_tokens]:
            if block_hash in own:
                break
            found += 1
        return found

    def _set_history(self, agent: Agent, history: History, found_blocks: int) -> None:
        old, old_windows = set(agent.hashes), self._window_keys(agent)
        agent.block_hashes, agent.tail_hash = history.block_hashes, history.tail_hash
        agent.num_tokens, agent.found_blocks = history.num_tokens, found_blocks
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
        own = set(agent.hashes)  # its new history's: counted among the sharers
        if any(self._sharers[block] > (block in own) for block, _ in map(split_key, passed)):
            for other in self.by_key.values():
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
        if self.retentions.expire():
            self._protect_pinned()
        idle_s = self.options.idle_s
        self.pool.demote_idle(idle_s)
        for agent in self.by_key.values():
            if agent.working and now - agent.stats.last_used > idle_s:
                agent.working = False
                for _, page in self._history_pages(agent):
                    if self.pool.tier_of(page) == TIER_WORKING_AGENT:
                        self.pool.retier(page, TIER_IDLE_AGENT)

    def pin(self, key: AgentKey, pinned: bool = True) -> Agent:
        """A pinned agent's hot blocks stay in memory, and its files on the disk (NotFound for
        an unknown agent: pinning creates none; PinLimit when its owner's pins would hold more
        of the pool than `max_pinned_share`)."""
        agent = self._known(key)
        if pinned and not self._pin_fits(agent):
            raise PinLimit(
                f"pinning agent {key.agent_id!r} would hold more than "
                f"{self.options.max_pinned_share:.0%} of the KV pool for this key's pins; "
                "unpin another agent first"
            )
        agent.pinned = pinned
        if pinned:
            self._pin(agent)
        else:
            self.pins.drop(key)
        self._protect_pinned()
        return agent

    def _protect_pinned(self) -> None:
        """The disk budget never drops the files of a pinned agent, nor a live retention's."""
        pinned = frozenset(h for a in self.by_key.values() if a.pinned for h in a.hashes)
        self.tiering.protected = pinned | self.retentions.protected()

    def _pin(self, agent: Agent) -> None:
        """Hold the pages the agent's next turn reads, and let go of those held for its last
        history (those its window moved past then leave as out of the window:
        `_let_go_of_passed`). A history grown past its owner's share is held by its files
        alone, until the agent is pinned again."""
        pages = [page for _, page in self._history_pages(agent)] if self._pin_fits(agent) else []
        self.pins.hold(agent.key, pages)

    def _pin_fits(self, agent: Agent) -> bool:
        """Whether the owner's pins, this agent's history in place of what it holds now, stay
        within `max_pinned_share` of the pool."""
        return self.pins.fits(agent.key, len(self._history_pages(agent)))

    def let_go_of_pins(self) -> int:
        """Release every pin's pages to the working agents' tier, and every retention's (their
        files stay on disk, where pins and retentions keep them): a request that nothing else
        stands in the way of must run, and a pin takes its pages back at its agent's next turn
        (a retention at its next use). Returns how many were held."""
        held = self.pins.let_go() + self.retentions.let_go()
        if held:
            log.info("pins let go of %d pages for a request that could not run beside them", held)
        return held

    def _history_pages(self, agent: Agent) -> list[tuple[int, int]]:
        """(key, page) of the pool pages the agent's next turn reads."""
        return self.prefix.history_pages(agent.hashes, agent.num_tokens)

    # -- the direct agent API: conversations, turns, forks (on the engine thread) -----------

    def create(self, key: AgentKey, conversation: Conversation) -> Agent:
        """A new agent with a conversation and nothing cached yet; Conflict if the id is taken
        in its owner's scope (the engine thread runs one call at a time, so of two creates of
        one id exactly one wins), ConversationTooLarge, ConversationQuotaExceeded or
        TooManyAgents past the limits. The caller then writes its manifest with
        `save_manifest`."""
        if key in self.by_key:
            raise Conflict(f"agent {key.agent_id!r} already exists")
        self.check_size(conversation)
        self.quota.check(key.owner, conversation)
        agent = self._add(Agent(key, conversation=conversation))
        self.quota.swap(key.owner, None, conversation)
        agent.stats.last_used = time.time()
        return agent

    def fork(self, parent_key: AgentKey, child_key: AgentKey) -> Agent:
        """A new agent holding the parent's conversation (the same value, not a copy: its
        manifest names the same file, and its owner's quota counts it once) whose cache is the
        parent's: the same blocks by hash, in memory or on disk, so the fork costs no block.
        Either side extending the shared partial tail copies it first (the scheduler's
        copy-on-write); deleting one keeps every block, and the conversation, the other still
        names."""
        parent = self._known(parent_key)
        child = self.create(child_key, parent.conversation or Conversation())
        history = History(list(parent.block_hashes), parent.tail_hash, parent.num_tokens)
        self._set_history(child, history, parent.found_blocks)
        return child

    def begin_turn(self, key: AgentKey, turn_id: str, message: str) -> tuple[Agent, Conversation]:
        """Hold the agent for one generate call of `message` and return it with its
        conversation so far; NotFound, Conflict while another call holds it, or
        ConversationTooLarge when the conversation and the message are past the limit."""
        agent = self._known(key)
        if agent.turn is not None:
            raise Conflict(f"agent {key.agent_id!r} is already generating")
        conversation = agent.conversation or Conversation()
        longer = conversation.with_turn(message, "")
        self.check_size(longer)
        self.quota.check(key.owner, longer, agent.conversation)
        agent.turn = turn_id
        return agent, conversation

    def end_turn(self, key: AgentKey, turn_id: str) -> bool:
        """Release the agent held by `turn_id`. False when that turn no longer holds it (it was
        ended already: releasing twice never frees a later turn's hold)."""
        agent = self.by_key.get(key)
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

    def _add(self, agent: Agent) -> Agent:
        """A new agent in its owner's scope, making room for it (`_make_room`) first."""
        self._make_room(agent.owner)
        self.by_key[agent.key] = agent
        self._per_owner[agent.owner] += 1
        return agent

    def _make_room(self, owner: str | None) -> None:
        """At `max_per_key`, the owner's least recently used agents that nothing needs (no
        conversation, not pinned, no turn, no request running) are forgotten, as many as it
        takes to make room for one (more than one when the limit was lowered since the
        manifests were written): their names go, their blocks stay as cache. TooManyAgents,
        and none forgotten, when too few may go."""
        limit = self.options.max_per_key
        excess = self._per_owner[owner] - limit + 1
        if excess <= 0:
            return
        running = {agent.key for agent in self._began.values()}
        spare = [
            a
            for a in self.by_key.values()
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

    def start_persist(self, keys: Iterable[AgentKey] | None = None) -> PendingPersist:
        """Queue writes of the named agents' hot pages (every hashed page worth keeping when
        None) that are not on disk yet. Runs on the engine thread (it reads the pool);
        `PendingPersist.wait` then waits for durability on any thread and writes the
        manifests."""
        everything = keys is None
        agents = (
            list(self.by_key.values())
            if everything
            else [self.by_key[k] for k in keys or () if k in self.by_key]
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
                hot.append((page, key, *content, self.prefix.marks_history_end(key)))
        return PendingPersist(agents, self.tiering.start_persist(hot), self.save_manifest)

    def persist(
        self, keys: Iterable[AgentKey] | None = None, timeout: float | None = None
    ) -> PersistResult:
        """`start_persist` and wait for it, on the calling (engine) thread."""
        return self.start_persist(keys).wait(timeout)

    def evict(self, keys: Iterable[AgentKey] | None = None) -> int:
        """Free the pool pages of the named agents (of every page when None) that are on disk
        and that neither a running request nor a pin holds; returns how many. `persist` first:
        a page not on disk stays, so an eviction never loses a cache."""
        if keys is None:
            pages = [key for key, _ in self.prefix.hot_pages()]
        else:
            agents = [self.by_key[k] for k in keys if k in self.by_key]
            pages = [k for agent in agents for h in agent.hashes for k in self.prefix.keys(h)]
        evicted = sum(self.prefix.discard(k) for k in pages if self.tiering.on_disk(k))
        self.tiering.count_evicted_on_request(evicted)
        return evicted

    def delete(self, key: AgentKey) -> bool:
        """Forget an agent: its manifest (conversation included), and the blocks it computed
        that no other agent uses, in memory (cached ones; a block a running request holds stays
        until it finishes) and on disk: deleting an agent is how a client has the server forget
        a conversation. Blocks it found cached (its owner's other requests', such as a system
        prompt they share) stay theirs. Conflict while a generate call holds it."""
        agent = self.by_key.get(key)
        if agent is None:
            return False
        if agent.turn is not None:
            raise Conflict(f"agent {key.agent_id!r} is generating; delete it once the call ends")
        self._forget(agent)
        gone = [
            page_key
            for block_hash in agent.computed
            if self._sharers[block_hash] <= 0
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
        if self.by_key.get(agent.key) is agent and agent.turn is None:
            self.delete(agent.key)

    def _forget(self, agent: Agent) -> None:
        """The agent's name, manifest and pins go; its blocks stay where they are. The
        manifest goes first: when it cannot be removed, PersistFailed, and the agent stays
        as it was (else it would come back at the next start, its pins leaked meanwhile)."""
        with self.manifest_lock:
            try:
                self.manifests.delete(agent.key)
            except OSError as exc:
                raise _not_durable(agent, "removed from", exc) from exc
            del self.by_key[agent.key]
        self._per_owner[agent.owner] -= 1
        self.quota.swap(agent.owner, agent.conversation, None)
        self.pins.drop(agent.key)
        if agent.pinned:
            self._protect_pinned()
        self._sharers -= Counter(agent.hashes)

    def census(self) -> tuple[int, int]:
        """(agents active within `idle_s`, agents idle)."""
        active = sum(agent.working for agent in self.by_key.values())
        return active, len(self.by_key) - active

    def describe(self, agent: Agent) -> dict[str, Any]:
        """The agent and its cache statistics, as plain data (taken on the engine thread)."""
        hot = self._history_pages(agent)
        keys = [key for block_hash in agent.hashes for key in self.prefix.keys(block_hash)]
        stats = agent.stats
        return {
            "agent_id": agent.agent_id,
            "owner": agent.owner,
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

    def save_manifest(
        self,
        agent: Agent,
        conversation: Conversation | None = None,
        history: History | None = None,
    ) -> bool:
        """Write the agent's manifest as it is now, on any thread (it does disk I/O: not the
        engine thread's). With `conversation`, that is written as the agent's, and becomes
        its own once it is on disk: how a turn commits, the agent held, so no other write of
        the manifest can come between. With `history`, that is the history it names (a turn's
        whose blocks are durable, while the agent may have gone on). False when the agent was
        deleted meanwhile; PersistFailed when the write failed, and then the file and the agent
        stay as they were."""
        with self.manifest_lock:
            if self.by_key.get(agent.key) is not agent:
                return False  # deleted (perhaps created again): this file is not ours any more
            kept = agent.conversation if conversation is None else conversation
            named = history or History(agent.block_hashes, agent.tail_hash, agent.num_tokens)
            manifest = AgentManifest(
                agent.agent_id,
                self.model_root.name,
                list(named.block_hashes),
                named.tail_hash,
                named.num_tokens,
                found_blocks=agent.found_blocks,
                pinned=agent.pinned,
                conversation=kept,
                owner=agent.owner,
            )
            try:
                self.manifests.save(manifest)
            except OSError as exc:
                raise _not_durable(agent, "written to", exc) from exc
            self.quota.swap(agent.owner, agent.conversation, kept)
            agent.conversation = kept
        self.tiering.enforce_budget()  # the manifest counts in the disk budget
        return True

    def _remember(self, manifest: AgentManifest) -> None:
        agent = Agent(
            manifest.key,
            list(manifest.block_hashes),
            manifest.tail_hash,
            manifest.num_tokens,
            manifest.pinned,
            conversation=manifest.conversation,
            found_blocks=manifest.found_blocks,
        )
        agent.stats.last_used = manifest.updated_at
        self.by_key[agent.key] = agent
        self._per_owner[agent.owner] += 1
        self.quota.swap(agent.owner, None, agent.conversation)
        self._sharers.update(agent.hashes)
        if agent.pinned:
            self.tiering.protected = self.tiering.protected | set(agent.hashes)

    def _known(self, key: AgentKey) -> Agent:
        agent = self.by_key.get(key)
        if agent is None:
            raise NotFound(f"no agent {key.agent_id!r}")
        return agent


def _not_durable(agent: Agent, done: str, exc: OSError) -> PersistFailed:
    """The error of a manifest that could not be `done` disk: logged in full, told to the
    client without the server's paths."""
    log.warning("manifest of agent %s not %s disk: %s", agent.agent_id, done, exc)
    return PersistFailed(
        f"agent {agent.agent_id!r} could not be {done} disk ({exc.strerror}); nothing was changed"
    )


def _summary(conversation: Conversation | None) -> dict[str, Any] | None:
    """What a description tells of a conversation: its size, never its text (a list of ninety
    forks of an 8 MB system prompt would carry 720 MB); `/messages` reads the text."""
    if conversation is None:
        return None
    return {
        "defaults": conversation.defaults.to_json(),
        "messages": len(conversation.messages),
        "text_bytes": conversation.text_bytes(),
    }
