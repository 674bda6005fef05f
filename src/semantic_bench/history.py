"""History scaling: time to first token of an agent's next turn, warm (its own cache) and cold
(the same prompt with nothing reusable), as its history grows — 1K, 2K, 4K tokens by default —
and the KV the server holds for that history.

Warm TTFT should stay nearly flat (only the new message is prefilled) while cold TTFT grows
with the history; `HistoryResult.flatness` is warm TTFT at the largest size ÷ at the smallest.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from semantic_bench.cache_counters import AgentKV, read_agent_kv
from semantic_bench.conversation import (
    Chat,
    Conversation,
    Probe,
    grow_history,
    new_conversation,
    send_probe,
)
from semantic_bench.workload import cached_share

HISTORY_TURNS = 3  # user/assistant turns after the system prompt


@dataclass(slots=True)
class HistoryPoint:
    """One history size: `repeats` warm probes and as many cold twins of the same prompts, and
    the KV the server held for the history once it was built (None: it does not say)."""

    target_tokens: int
    history_tokens: int  # as the server counted it once the history was built
    warm: list[Probe]
    cold: list[Probe]
    kv: AgentKV | None = None

    @property
    def warm_ttft_s(self) -> float:
        return statistics.median(p.ttft_s for p in self.warm)

    @property
    def cold_ttft_s(self) -> float:
        return statistics.median(p.ttft_s for p in self.cold)

    @property
    def speedup(self) -> float:
        """Cold TTFT ÷ warm TTFT: how much the agent's cache saves it."""
        return self.cold_ttft_s / self.warm_ttft_s if self.warm_ttft_s > 0 else 0.0

    @property
    def prompt_tokens(self) -> int:
        return int(statistics.median(p.prompt_tokens for p in self.warm))

    @property
    def warm_cached_share(self) -> float | None:
        return cached_share(self.warm)

    @property
    def cold_cached_share(self) -> float | None:
        return cached_share(self.cold)

    @property
    def token_mismatch(self) -> float:
        """Largest |cold − warm| ÷ warm prompt tokens over the repeats: the twins are meant to
        be the same length (±1%), so their prefill does the same work."""
        return max(
            abs(cold.prompt_tokens - warm.prompt_tokens) / max(warm.prompt_tokens, 1)
            for warm, cold in zip(self.warm, self.cold, strict=True)
        )


@dataclass(slots=True)
class HistoryResult:
    repeats: int
    points: list[HistoryPoint]

    @property
    def flatness(self) -> float | None:
        """Warm TTFT at the largest size ÷ at the smallest (1.0 = flat); None with one size."""
        if len(self.points) < 2:
            return None
        smallest = min(self.points, key=lambda p: p.target_tokens)
        largest = max(self.points, key=lambda p: p.target_tokens)
        return largest.warm_ttft_s / smallest.warm_ttft_s if smallest.warm_ttft_s > 0 else None

    def at(self, target_tokens: int) -> HistoryPoint | None:
        return next((p for p in self.points if p.target_tokens == target_tokens), None)


async def run_history(
    chat: Chat,
    sizes: tuple[int, ...],
    repeats: int,
    markers: Iterator[str],
    step: Callable[[str], None],
) -> HistoryResult:
    """Each size in turn, smallest first; probes run one at a time so each TTFT is a lone
    request's."""
    points = []
    for size in sorted(sizes):
        convo = new_conversation(chat.plan, f"history-{size}", size)
        await grow_history(chat, convo, size, HISTORY_TURNS, step)
        kv = await read_agent_kv(chat.client, convo.session_id)
        point = await _probe_size(chat, convo, size, repeats, markers, step)
        point.kv = kv
        points.append(point)
    return HistoryResult(repeats, points)


async def _probe_size(
    chat: Chat,
    convo: Conversation,
    size: int,
    repeats: int,
    markers: Iterator[str],
    step: Callable[[str], None],
) -> HistoryPoint:
    """Per repeat: a new short message on the warm history (a branch: the history itself does
    not grow), then the cold twin of exactly that prompt under a fresh session id."""
    warm: list[Probe] = []
    cold: list[Probe] = []
    for repeat in range(repeats):
        question = chat.plan.text(f"{convo.session_id}-q-{repeat}", chat.plan.user_tokens)
        user = f"Question {repeat}: {question}"
        warm.append(await send_probe(chat, convo.messages(user), convo.session_id))
        step(f"{size} tokens, warm: TTFT {warm[-1].ttft_s:.3f} s")
        twin = convo.cold_twin(next(markers), f"{convo.session_id}-cold-{repeat}")
        cold.append(await send_probe(chat, twin.messages(user), twin.session_id))
        step(f"{size} tokens, cold: TTFT {cold[-1].ttft_s:.3f} s")
    return HistoryPoint(size, convo.history_tokens, warm, cold)
