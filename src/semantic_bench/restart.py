"""After a restart: agents build histories at the largest history size, the server is restarted
on the same cache folder (SIGTERM → exit → start → ready), and each agent's next turn should
find most of its history on disk — its TTFT near a warm turn's, far below a cold one's."""

from __future__ import annotations

import asyncio
import statistics
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from semantic_bench.conversation import Chat, Probe, grow_history, new_conversation, send_probe
from semantic_bench.server import RestartTiming
from semantic_bench.workload import cached_share

RESTART_TURNS = 2  # turns each agent takes before the restart


@dataclass(slots=True, frozen=True)
class RestartTurn:
    """One agent's first turn after the restart."""

    agent: int
    history_tokens: int  # what the agent had before the restart: all of it could be on disk
    probe: Probe

    @property
    def history_share(self) -> float | None:
        """Cached tokens ÷ the history: how much of it came back from disk."""
        cached = self.probe.cached_tokens
        return cached / self.history_tokens if cached is not None and self.history_tokens else None


@dataclass(slots=True)
class RestartResult:
    """`cold_ttft_s` is a cold prompt of the same size: the history phase's median when it ran
    that size, else one cold twin measured here (`cold_measured_here`)."""

    target_tokens: int
    timing: RestartTiming
    turns: list[RestartTurn]
    cold_ttft_s: float | None
    cold_measured_here: bool

    @property
    def ttft_s(self) -> float:
        return statistics.median(t.probe.ttft_s for t in self.turns)

    @property
    def cached_share(self) -> float | None:
        """Cached ÷ prompt tokens over the agents' after-restart turns."""
        return cached_share([t.probe for t in self.turns])

    @property
    def ratio_to_cold(self) -> float | None:
        """After-restart TTFT ÷ cold TTFT of the same size (lower is better)."""
        return self.ttft_s / self.cold_ttft_s if self.cold_ttft_s else None


async def run_restart(
    chat: Chat,
    size: int,
    agents: int,
    restart: Callable[[], RestartTiming],
    cold_ttft_s: float | None,
    markers: Iterator[str],
    step: Callable[[str], None],
) -> RestartResult:
    """Agents grow their histories together; after the restart (run on a worker thread: it
    blocks until the new server is ready) their next turns run one at a time, so each TTFT is a
    lone request's. `chat`'s client drops the old server's connections and reconnects."""
    convos = [new_conversation(chat.plan, f"restart-{i}", size) for i in range(agents)]
    await asyncio.gather(*(grow_history(chat, c, size, RESTART_TURNS, step) for c in convos))
    timing = await asyncio.to_thread(restart)
    step(f"restarted: stop {timing.stop_s:.1f} s, ready {timing.ready_s:.1f} s")
    turns: list[RestartTurn] = []
    users = [
        f"After the restart: {chat.plan.text(c.session_id + '-after', chat.plan.user_tokens)}"
        for c in convos
    ]
    for i, (convo, user) in enumerate(zip(convos, users, strict=True)):
        probe = await send_probe(chat, convo.messages(user), convo.session_id)
        turns.append(RestartTurn(i, convo.history_tokens, probe))
        step(f"agent {i}: TTFT {probe.ttft_s:.3f} s, {probe.cached_tokens} cached")
    measured_here = cold_ttft_s is None
    if measured_here:
        twin = convos[0].cold_twin(next(markers), f"{convos[0].session_id}-cold")
        cold_ttft_s = (await send_probe(chat, twin.messages(users[0]), twin.session_id)).ttft_s
        step(f"cold twin: TTFT {cold_ttft_s:.3f} s")
    return RestartResult(size, timing, turns, cold_ttft_s, measured_here)
