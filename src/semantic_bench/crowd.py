"""Crowd: many agents at once whose histories outgrow the KV pool, each sending its next turn as
soon as its answer arrives — the concurrent counterpart of the round-robin pressure phase, and
the normal case for agents. It runs once per kind of client (named: a `session_id` in every
body; anonymous: none at all, as most agent frameworks send) and reports how much of each warm
turn's history the server reused, what it prefilled against what was new, its TTFT, throughput
and errors, and the server's own cache counters over the run (`GET /admin/cache`)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx

from semantic_bench.cache_counters import CacheCounters, counters_over, read_cache_counters
from semantic_bench.conversation import Chat
from semantic_bench.errors import BenchError
from semantic_bench.options import Clients
from semantic_bench.plan import AgentScript, WorkloadSpec, agent_scripts
from semantic_bench.pressure import PoolBudget
from semantic_bench.workload import (
    LatencySummary,
    StreamResult,
    chat_body,
    stream_chat,
)

ERROR_CHARS = 300  # of an error's text kept in the record


@dataclass(slots=True, frozen=True)
class CrowdTurn:
    """One turn of one agent. `history_tokens` is what the agent sent and received before it
    (its previous prompt and answer): all of it could have come from cache. `gaps_s`: the time
    between each streamed token of its answer and the next. `sent_s`: when its request went,
    in seconds from the start of the run."""

    agent: int
    turn: int
    history_tokens: int
    ttft_s: float
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int | None  # None: the server does not report it
    gaps_s: tuple[float, ...] = ()
    sent_s: float = 0.0

    @property
    def warm(self) -> bool:
        return self.turn > 0

    @property
    def new_tokens(self) -> int:
        """The tokens only this turn brought: its user message and the template around it."""
        return max(self.prompt_tokens - self.history_tokens, 0)


@dataclass(slots=True)
class CrowdRun:
    """One run of the crowd with one kind of client, on a server of its own when the bench
    spawned it. `cache` is the server's counters over the run (None: no `/admin/cache`)."""

    clients: Clients
    budget: PoolBudget | None  # None: the target's pool is not the bench's to size
    turns: list[CrowdTurn]
    wall_s: float
    cache: CacheCounters | None
    errors: list[str] = field(default_factory=list)  # one per failed request

    @property
    def warm_turns(self) -> list[CrowdTurn]:
        return [t for t in self.turns if t.warm]

    @property
    def hit_rate(self) -> float | None:
        """Σ cached ÷ Σ history over warm turns, each credited at most its history; None when
        the server does not report cached tokens (or no warm turn ran)."""
        warm = self.warm_turns
        history = sum(t.history_tokens for t in warm)
        if not warm or history == 0 or any(t.cached_tokens is None for t in warm):
            return None
        return sum(min(t.cached_tokens or 0, t.history_tokens) for t in warm) / history

    @property
    def prefill_ratio(self) -> float | None:
        """Σ prefilled (prompt − cached) ÷ Σ new tokens over warm turns: 1.0 means the warm turns
        paid for their new tokens and nothing more."""
        warm = self.warm_turns
        new = sum(t.new_tokens for t in warm)
        if not warm or new == 0 or any(t.cached_tokens is None for t in warm):
            return None
        return sum(t.prompt_tokens - (t.cached_tokens or 0) for t in warm) / new

    @property
    def warm_ttft(self) -> LatencySummary:
        return LatencySummary.of([t.ttft_s for t in self.warm_turns])

    @property
    def cold_ttft(self) -> LatencySummary:
        return LatencySummary.of([t.ttft_s for t in self.turns if not t.warm])

    @property
    def inter_token(self) -> LatencySummary:
        """Inter-token latency: every gap between two streamed tokens of one answer, pooled
        over all answers (so a long answer weighs as its tokens do)."""
        return LatencySummary.of([gap for t in self.turns for gap in t.gaps_s])

    @property
    def longest_gap_s(self) -> float | None:
        """The longest wait between two tokens of one answer, over every answer: what an answer
        preempted for a newcomer waits before it resumes. None without gaps."""
        return max((gap for t in self.turns for gap in t.gaps_s), default=None)

    @property
    def output_tok_s(self) -> float:
        tokens = sum(t.completion_tokens for t in self.turns)
        return tokens / self.wall_s if self.wall_s > 0 else 0.0


@dataclass(slots=True)
class CrowdResult:
    """The crowd's shape and one run per kind of client, in the order they ran."""

    spec: WorkloadSpec
    runs: list[CrowdRun] = field(default_factory=list)


async def run_crowd(
    chat: Chat,
    spec: WorkloadSpec,
    clients: Clients,
    budget: PoolBudget | None,
    step: Callable[[str], None],
) -> CrowdRun:
    """Every agent at once (`asyncio.gather`), each through its turns in order; `step` is
    called once per turn, run or skipped. The server's counters are read before and after."""
    scripts = agent_scripts(spec, chat.plan.run_tag, chat.plan.text, group=f"crowd-{clients}")
    before = await read_cache_counters(chat.client)
    started = time.perf_counter()
    agents = [_Agent(chat, script, spec.max_tokens, clients, step, started) for script in scripts]
    await asyncio.gather(*(agent.run() for agent in agents))
    wall_s = time.perf_counter() - started
    cache = counters_over(before, await read_cache_counters(chat.client))
    turns = [turn for agent in agents for turn in agent.turns]
    errors = [agent.error for agent in agents if agent.error is not None]
    return CrowdRun(clients, budget, turns, wall_s, cache, errors)


@dataclass(slots=True)
class _Agent:
    """One agent of the crowd: its turns in order, each sent once the previous answer is in.
    A failed request is recorded and ends the agent's remaining turns, never the phase."""

    chat: Chat
    script: AgentScript
    answer_tokens: int
    clients: Clients
    step: Callable[[str], None]
    started: float  # the run's start, on `time.perf_counter()`'s clock
    turns: list[CrowdTurn] = field(default_factory=list)
    error: str | None = None

    async def run(self) -> None:
        answers: list[str] = []
        for turn in range(len(self.script.users)):
            if self.error is not None:
                self.step(f"agent {self.script.index} turn {turn}: skipped after an error")
            elif (reply := await self._send(turn, answers)) is not None:
                answers.append(reply.text)
                cached = "?" if reply.cached_tokens is None else f"{reply.cached_tokens:,}"
                self.step(
                    f"agent {self.script.index} turn {turn}: TTFT {reply.ttft_s:.2f} s, "
                    f"{cached} of {reply.prompt_tokens:,} tokens cached"
                )

    async def _send(self, turn: int, answers: list[str]) -> StreamResult | None:
        """One turn, recorded; None (and `error` set) if its request failed."""
        session = self.script.session_id if self.clients is Clients.NAMED else None
        body = chat_body(
            self.chat.model, self.script.messages(answers), self.answer_tokens, session
        )
        where = f"agent {self.script.index} turn {turn}"
        sent_s = time.perf_counter() - self.started
        try:
            reply = await stream_chat(self.chat.client, body)
        except (BenchError, httpx.HTTPError, ValueError) as exc:
            self.error = " ".join(f"{where}: {exc}".split())[:ERROR_CHARS]  # one line for tables
            self.step(f"{where}: error")
            return None
        last = self.turns[-1] if self.turns else None
        history = last.prompt_tokens + last.completion_tokens if last else 0
        self.turns.append(
            CrowdTurn(
                self.script.index,
                turn,
                history,
                reply.ttft_s,
                reply.prompt_tokens,
                reply.completion_tokens,
                reply.cached_tokens,
                tuple(reply.gaps_s),
                sent_s,
            )
        )
        return reply
