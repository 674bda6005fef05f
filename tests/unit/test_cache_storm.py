"""A seeded storm over the engine and a pool too small for its agents: conversations (named and
anonymous) take turns at random moments, one-off prompts come and go, clients abort, the cache
is persisted and evicted, agents are forked, pinned, unpinned and deleted and the server
restarts, all interleaved with the engine's steps. After every step the pool and the prefix
index must be consistent; every answer must be the one the same prompt gets alone in a roomy
pool (the fake runner computes each token from the context it reads back through the block
tables, so a wrong restore, a reused block of someone else's or a lost chunk changes it); an
aborted answer must be a prefix of that; a warm turn must find its whole history cached, in
memory or on disk; and when all is done, no block is held.

Models: full attention, hybrid (one full-attention layer, three sliding) and sliding only.
`SEMANTIC_STORM_SEEDS=N` runs N seeds instead of the few CI runs; `SEMANTIC_STORM_FORKS=N` lets
up to N forks join (4 unless set).

A seed replays the same storm however loaded the machine is: the scheduler's clock (its
patience with one-offs, the queue timeout) and the agents' are the storm's own, moved a fixed
step a tick and while a request waits for room with nothing else to do, and each engine step
comes after the disk reader's work of the step before (restores, history-end marks) has
landed. The disk writer's pace does not matter: a queued write counts as on disk, and a
queued deletion as done.
"""

from __future__ import annotations

import os
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from semantic.cache.agents import store
from semantic.cache.pages import block_manager
from semantic.core import AgentKey, FinishReason, Request, SamplingParams, TokenEvent
from semantic.engine import scheduler
from semantic.engine.engine import Engine
from semantic.errors import PinLimit
from semantic.models.served import ServedModel
from tests.unit.fakes import make_engine

BLOCK = 8  # make_engine's block size
SEEDS = range(int(os.environ.get("SEMANTIC_STORM_SEEDS", "3")))
TICKS = 300
LONGEST_HISTORY = 10 * BLOCK  # a conversation longer than this starts over
MOST_FORKS = int(os.environ.get("SEMANTIC_STORM_FORKS", "4"))
PLAIN: dict[str, Any] = {"num_blocks": 24}
# One full-attention layer and three sliding ones: a block takes four pages, one per group.
HYBRID: dict[str, Any] = {"layer_windows": (None, 12, 12, 12), "num_blocks": 48}
SLIDING: dict[str, Any] = {"layer_windows": (12,), "num_blocks": 24}  # no page reads every block
TICK_S = 0.02  # the storm's clock a tick: about what one takes on an idle machine
WAIT_S = 0.1  # and a step that did nothing, waiting for room (ONE_OFF_PATIENCE_S is 1 s)


class Clock:
    """The storm's clock, standing in for `time` where the engine decides by it: it moves only
    when the storm moves it."""

    def __init__(self) -> None:
        self.now = time.monotonic()  # requests the storm does not date still compare sanely
        self.epoch = time.time() - self.now

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        return self.epoch + self.now


@dataclass
class Conversation:
    """One client's conversation: its history so far (prompts and answers), the turn in flight,
    and the least its next prompt must find cached (None when nothing can be promised)."""

    name: str
    agent_id: str | None
    history: list[int]
    in_flight: str | None = None
    must_find: int | None = None


@dataclass
class Sent:
    """One request as its client sent it, and the events it got back."""

    prompt: list[int]
    max_tokens: int
    conversation: Conversation | None
    events: list[TokenEvent] = field(default_factory=list)


class Storm:
    """The clients' side of the storm, and what it checks of each answer."""

    def __init__(
        self, served: ServedModel, tmp_path: Path, model: dict[str, Any], seed: int, clock: Clock
    ):
        self.served, self.cache_dir, self.model = served, tmp_path / "cache", model
        self.rng = random.Random(seed)
        self.clock = clock
        self.engine: Engine = make_engine(served, self.cache_dir, **model)[0]
        self.roomy: Engine = make_engine(
            served,
            tmp_path / "roomy",
            num_blocks=4096,
            layer_windows=model.get("layer_windows", ()),
        )[0]
        self.answers: dict[tuple[tuple[int, ...], int], list[int]] = {}
        self.sent: dict[str, Sent] = {}
        self.ids = 0
        shared = self.tokens(2 * BLOCK)  # a system prompt two agents share
        self.conversations = [
            Conversation(
                f"c{i}",
                f"agent-{i}" if i < 5 else None,
                [*shared, *self.tokens(BLOCK)] if i < 2 else self.tokens(3 * BLOCK + i),
            )
            for i in range(8)
        ]

    def tokens(self, n: int) -> list[int]:
        return [self.rng.randrange(3, 400) for _ in range(n)]

    # -- what the clients do -----------------------------------------------------------------

    def act(self) -> None:
        roll = self.rng.random()
        idle = [c for c in self.conversations if c.in_flight is None]
        if roll < 0.30 and idle:
            self.take_a_turn(self.rng.choice(idle))
        elif roll < 0.36:
            self.send(self.tokens(self.rng.randrange(4, 3 * BLOCK)), None, None)
        elif roll < 0.42 and self.sent:
            self.engine.abort(self.rng.choice(list(self.sent)))
        elif roll < 0.45:
            self.engine.agents.persist()
        elif roll < 0.48:
            self.engine.agents.persist()
            self.engine.agents.evict()
        elif roll < 0.49:
            self.restart()
        elif roll < 0.50:
            self.delete_an_agent([c for c in idle if c.agent_id is not None])
        elif roll < 0.52:
            self.pin_or_unpin([c for c in self.conversations if c.agent_id is not None])
        elif roll < 0.55:
            self.fork([c for c in idle if c.agent_id is not None])

    def take_a_turn(self, conversation: Conversation) -> None:
        if len(conversation.history) > LONGEST_HISTORY:  # it starts over, as a compaction does
            conversation.history = self.tokens(2 * BLOCK)
            conversation.must_find = None
        prompt = [*conversation.history, *self.tokens(self.rng.randrange(1, BLOCK))]
        conversation.in_flight = self.send(prompt, conversation.agent_id, conversation)

    def send(
        self, prompt: list[int], agent_id: str | None, conversation: Conversation | None
    ) -> str:
        self.ids += 1
        request_id = f"r{self.ids}"
        sent = Sent(prompt, self.rng.randrange(1, 12), conversation)
        self.sent[request_id] = sent
        sampling = SamplingParams(temperature=0.0, max_tokens=sent.max_tokens)
        request = Request(request_id, prompt, sampling, agent_id, arrival_time=self.clock.now)
        self.engine.submit(request, sent.events.append)
        return request_id

    def restart(self) -> None:
        """A graceful restart: what runs is aborted, hot caches are persisted."""
        self.engine.stop()
        self.collect()
        self.engine = make_engine(self.served, self.cache_dir, **self.model)[0]

    def pin_or_unpin(self, named: list[Conversation]) -> None:
        """Pin an agent, or unpin it; a pin past the pool's share for pins is refused."""
        agent_id = self.rng.choice(named).agent_id
        agent = self.engine.agents.get(AgentKey(agent_id, None)) if agent_id else None
        if agent is not None:
            try:
                self.engine.agents.pin(agent.key, pinned=not agent.pinned)
            except PinLimit:
                assert not agent.pinned

    def fork(self, idle_named: list[Conversation]) -> None:
        """A new agent that continues an idle one's history, sharing its blocks."""
        forks = sum(c.name.startswith("fork") for c in self.conversations)
        parent = self.rng.choice(idle_named) if idle_named and forks < MOST_FORKS else None
        if parent is None or self.engine.agents.get(AgentKey(str(parent.agent_id))) is None:
            return
        child = Conversation(f"fork{forks}", f"{parent.agent_id}-fork{forks}", [*parent.history])
        child.must_find = parent.must_find
        self.engine.agents.fork(AgentKey(str(parent.agent_id)), AgentKey(str(child.agent_id)))
        self.conversations.append(child)

    def delete_an_agent(self, idle_named: list[Conversation]) -> None:
        if idle_named:
            conversation = self.rng.choice(idle_named)
            assert conversation.agent_id is not None
            self.engine.agents.delete(AgentKey(conversation.agent_id, None))
            conversation.must_find = None  # its blocks may be gone from memory and disk

    # -- the engine's side -------------------------------------------------------------------

    def step(self) -> None:
        """One step that computes something, or none when there is nothing to do. Each waits
        for the disk reader's work of the one before, and one that did nothing while no restore
        is in flight (a request waits for room) moves the clock on: a seed replays the same
        storm."""
        deadline = time.perf_counter() + 30
        while True:
            self.engine.tiering.reads_done(30)
            if self.engine.step() or not self.engine.scheduler.has_work:
                break
            assert time.perf_counter() < deadline, "the engine has work it never does"
            if not self.engine.scheduler.restoring:
                self.clock.now += WAIT_S
        self.clock.now += TICK_S
        self.engine.pool.check_integrity()
        self.engine.prefix.check_integrity()
        self.collect()

    def drain(self) -> None:
        self.step()
        while self.engine.scheduler.has_work or self.engine.write_behind.pending:
            self.step()
        self.collect()
        assert not self.sent, f"requests never ended: {sorted(self.sent)}"
        for agent in list(self.engine.agents.by_key.values()):
            if agent.pinned:  # its pin holds its pages
                self.engine.agents.pin(agent.key, pinned=False)
        assert self.engine.pool.num_held == 0

    # -- the checks ----------------------------------------------------------------------------

    def collect(self) -> None:
        for request_id, sent in list(self.sent.items()):
            if sent.events and sent.events[-1].final:
                del self.sent[request_id]
                self.check(request_id, sent)

    def check(self, request_id: str, sent: Sent) -> None:
        last = sent.events[-1]
        tokens = [t for e in sent.events for t in e.token_ids]
        alone = self.alone(sent.prompt, sent.max_tokens)
        conversation = sent.conversation
        if conversation is not None:
            conversation.in_flight = None
        if last.finish_reason == FinishReason.ABORT:
            assert tokens == alone[: len(tokens)], f"{request_id}: an aborted answer went astray"
            return
        assert last.error is None, f"{request_id} failed: {last.error!r}"
        assert tokens == alone, f"{request_id}: the answer differs from the one it gets alone"
        assert last.usage is not None
        if conversation is None:
            return
        if conversation.must_find is not None:
            assert last.usage.cached_tokens >= conversation.must_find, (
                f"{request_id} ({conversation.name}): {last.usage.cached_tokens} tokens cached "
                f"of a history of {conversation.must_find + 1}; {self.what_it_knows(conversation)}"
            )
        conversation.history = [*sent.prompt, *tokens]
        # All but the answer's last token, which was sampled and never computed.
        conversation.must_find = len(conversation.history) - 1

    def what_it_knows(self, conversation: Conversation) -> str:
        """The server's statistics of a conversation's agent, to explain a miss."""
        agent = conversation.agent_id and self.engine.agents.get(AgentKey(conversation.agent_id))
        return str(self.engine.agents.describe(agent)) if agent else "no agent"

    def alone(self, prompt: list[int], max_tokens: int) -> list[int]:
        key = (tuple(prompt), max_tokens)
        if key not in self.answers:
            events: list[TokenEvent] = []
            sampling = SamplingParams(temperature=0.0, max_tokens=max_tokens)
            request_id = f"alone-{len(self.answers)}"
            request = Request(request_id, prompt, sampling, arrival_time=self.clock.now)
            self.roomy.submit(request, events.append)
            self.roomy.run_until_idle()
            assert events[-1].error is None
            self.answers[key] = [t for e in events for t in e.token_ids]
        return self.answers[key]


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("model", [PLAIN, HYBRID, SLIDING], ids=["plain", "hybrid", "sliding"])
def test_a_storm_of_turns_aborts_evictions_and_restarts_keeps_every_answer_and_every_cache(
    served: ServedModel,
    tmp_path: Path,
    model: dict[str, Any],
    seed: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = Clock()
    for module in (scheduler, block_manager):  # patience with one-offs, the queue timeout
        monkeypatch.setattr(module, "time", SimpleNamespace(monotonic=clock.monotonic))
    monkeypatch.setattr(store, "time", SimpleNamespace(time=clock.time))  # idle agents
    storm = Storm(served, tmp_path, model, seed, clock)
    for _ in range(TICKS):
        storm.act()
        storm.step()
    storm.drain()
    assert storm.answers, "no answer was checked"
