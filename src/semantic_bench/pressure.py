"""Pressure: more agents than the KV pool holds at once, taking turns round-robin, so each warm
turn's history has usually left memory for disk. Reports the warm-turn hit rate, the misses and
warm TTFT; when the bench spawns the server it sizes the pool to hold well under all agents."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from semantic_bench.conversation import TURN_OVERHEAD_TOKENS, Chat
from semantic_bench.plan import WorkloadSpec, agent_scripts
from semantic_bench.workload import LatencySummary, cached_share, chat_body, stream_chat

POOL_SHARE = 0.4  # the pool the bench gives a spawned server, as a share of all histories
MIN_POOL_AGENTS = 3  # but never so small that a few agents' turns cannot run side by side
MISS_SHARE = 0.5  # a warm turn that reused less than this share of its history missed


@dataclass(slots=True, frozen=True)
class PoolBudget:
    """`needed_mb`: every agent's final history at once; `budget_mb`: the pool it is given."""

    needed_mb: float
    budget_mb: int


def pool_budget(
    spec: WorkloadSpec,
    bytes_per_token: int,
    share: float = POOL_SHARE,
    floor_agents: int = MIN_POOL_AGENTS,
    block_tokens: int = 1,
) -> PoolBudget:
    """A pool of `share` of every agent's final history at once (each in whole blocks of
    `block_tokens`), but room for at least `floor_agents` of them. SmolLM2-135M in bf16 (23,040
    bytes per token): twelve pressure agents of ~1,200 tokens need ~320 MiB; the pool gets
    ~130 MiB."""
    per_turn = spec.user_tokens + spec.max_tokens + TURN_OVERHEAD_TOKENS
    blocks = math.ceil((spec.system_tokens + spec.turns * per_turn) / block_tokens)
    agent_bytes = blocks * block_tokens * bytes_per_token
    needed = spec.agents * agent_bytes
    budget = max(needed * share, floor_agents * agent_bytes)
    return PoolBudget(needed / 2**20, math.ceil(budget / 2**20))


@dataclass(slots=True, frozen=True)
class PressureTurn:
    """One turn of one agent. `history_tokens` is what the agent had sent and received before
    it (the previous prompt and answer): all of that could be served from cache."""

    agent: int
    turn: int
    history_tokens: int
    ttft_s: float
    prompt_tokens: int
    cached_tokens: int | None

    @property
    def warm(self) -> bool:
        return self.turn > 0

    @property
    def missed(self) -> bool:
        """A warm turn that got well under its history back: evicted and not found on disk."""
        return self.warm and (self.cached_tokens or 0) < MISS_SHARE * self.history_tokens


@dataclass(slots=True)
class PressureResult:
    agents: int
    turns_per_agent: int
    budget: PoolBudget | None  # None: the target's pool is not the bench's to size
    turns: list[PressureTurn]

    @property
    def warm_turns(self) -> list[PressureTurn]:
        return [t for t in self.turns if t.warm]

    @property
    def hit_rate(self) -> float | None:
        """Sum of cached tokens ÷ sum of prompt tokens over the warm turns; None if the server
        does not report cached tokens."""
        return cached_share(self.warm_turns)

    @property
    def misses(self) -> int:
        return sum(t.missed for t in self.turns)

    @property
    def warm_ttft(self) -> LatencySummary:
        return LatencySummary.of([t.ttft_s for t in self.warm_turns])

    @property
    def cold_ttft(self) -> LatencySummary:
        return LatencySummary.of([t.ttft_s for t in self.turns if not t.warm])


async def run_pressure(
    chat: Chat, spec: WorkloadSpec, budget: PoolBudget | None, step: Callable[[str], None]
) -> PressureResult:
    """Turn 0 of every agent, then turn 1 of every agent, ...: one request at a time, so the
    least recently used agent is always the one whose turn comes next."""
    scripts = agent_scripts(spec, chat.plan.run_tag, chat.plan.text, group="pressure")
    answers: dict[int, list[str]] = {script.index: [] for script in scripts}
    history = dict.fromkeys(answers, 0)
    turns: list[PressureTurn] = []
    for turn in range(spec.turns):
        for script in scripts:
            messages = script.messages(answers[script.index])
            body = chat_body(chat.model, messages, spec.max_tokens, script.session_id)
            reply = await stream_chat(chat.client, body)
            turns.append(
                PressureTurn(
                    script.index,
                    turn,
                    history[script.index],
                    reply.ttft_s,
                    reply.prompt_tokens,
                    reply.cached_tokens,
                )
            )
            answers[script.index].append(reply.text)
            history[script.index] = reply.prompt_tokens + reply.completion_tokens
            step(f"agent {script.index} turn {turn}: {reply.cached_tokens} cached")
    return PressureResult(spec.agents, spec.turns, budget, turns)
