"""The HTTP side of the benchmark: one streamed chat completion timed delta by delta, the
measurements built from it, and the concurrent multi-agent, multi-turn workload against any
OpenAI-compatible server.

Only the public HTTP API is used, so the same numbers can be taken for llama.cpp, vLLM or ollama.
Extension fields (`session_id`, `ignore_eos`, `min_tokens`) are ones other servers ignore. A
server that does not stream its usage (llama-cpp-python's does not honour
`stream_options.include_usage`) gets its answer's tokens counted one per content delta, as it
streams them, and its prompt counted by a non-streamed answer where the bench needs the size.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx

from semantic_bench.errors import BenchError
from semantic_bench.plan import DECODE_TOKENS, AgentScript, BenchPlan, Message, sentences

CHAT_PATH = "/v1/chat/completions"
CALIBRATION_WORDS = 300


class PromptUsage(Protocol):
    """A measured request's prompt tokens and how many of them the server took from its cache."""

    @property
    def prompt_tokens(self) -> int: ...

    @property
    def cached_tokens(self) -> int | None: ...  # None: the server does not report it


def cached_share(items: Iterable[PromptUsage]) -> float | None:
    """Sum of cached tokens ÷ sum of prompt tokens over the items that report cached tokens;
    None if none do (or they sent no prompt tokens)."""
    reported = [i for i in items if i.cached_tokens is not None]
    prompt = sum(i.prompt_tokens for i in reported)
    if not reported or prompt == 0:
        return None
    return sum(i.cached_tokens or 0 for i in reported) / prompt


@dataclass(slots=True)
class StreamResult:
    """One streamed completion. Times are `time.perf_counter()` seconds; `first_at`/`last_at`
    are when the first and last non-empty content deltas arrived, `gaps_s` the time between
    each content delta and the next (one token each, unless the server held text back)."""

    sent_at: float
    first_at: float
    last_at: float
    text: str
    prompt_tokens: int  # 0: the server streamed no usage
    completion_tokens: int
    cached_tokens: int | None  # None: the server does not report prompt_tokens_details
    gaps_s: list[float] = field(default_factory=list)

    @property
    def ttft_s(self) -> float:
        return self.first_at - self.sent_at


@dataclass(slots=True)
class _StreamState:
    """What a stream has delivered so far; becomes a `StreamResult` at `[DONE]`."""

    first_at: float | None = None
    last_at: float | None = None
    deltas: int = 0  # content deltas: the answer's tokens where the server streams no usage
    pieces: list[str] = field(default_factory=list)
    gaps_s: list[float] = field(default_factory=list)
    usage: dict[str, Any] | None = None

    def take(self, chunk: dict[str, Any], now: float) -> None:
        if chunk.get("error"):
            raise BenchError(f"error in stream: {chunk['error']}")
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            # Reasoning models stream their first tokens as reasoning_content; they count too.
            piece = delta.get("content") or delta.get("reasoning_content") or ""
            if piece:
                self.first_at = now if self.first_at is None else self.first_at
                if self.last_at is not None:
                    self.gaps_s.append(now - self.last_at)
                self.last_at = now
                self.deltas += 1
                self.pieces.append(delta.get("content") or "")
            elif choice.get("finish_reason") and self.first_at is None:
                # A lone token that decodes to no text (a special token, half a UTF-8 char)
                # still ended the prefill: time it by the finish chunk.
                self.first_at = self.last_at = now
        if chunk.get("usage"):
            self.usage = chunk["usage"]


def chat_body(
    model: str, messages: list[Message], max_tokens: int, session_id: str | None
) -> dict[str, Any]:
    """The request every phase sends: streamed, greedy, exactly `max_tokens` where honoured.
    `session_id=None` sends none at all, as most agent frameworks' clients do."""
    body: dict[str, Any] = {
        "model": model,
        "messages": messages,
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": 0,
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "min_tokens": max_tokens,
    }
    return body if session_id is None else body | {"session_id": session_id}


async def stream_chat(client: httpx.AsyncClient, body: dict[str, Any]) -> StreamResult:
    """POST one streamed chat completion and time its content deltas as they arrive."""
    state = _StreamState()
    sent_at = time.perf_counter()
    try:
        async with client.stream("POST", CHAT_PATH, json=body) as response:
            await _check_status(response)
            async for line in response.aiter_lines():
                if not line.startswith("data:"):
                    continue  # blank separators, `: keep-alive` comments, other SSE fields
                data = line[5:].removeprefix(" ")
                if data.startswith("[DONE]"):
                    break
                state.take(json.loads(data), time.perf_counter())
    except httpx.TransportError as exc:
        raise BenchError(f"{client.base_url}{CHAT_PATH}: {exc!r}") from exc
    return _finish(state, sent_at)


async def _check_status(response: httpx.Response) -> None:
    if response.status_code != 200:
        detail = (await response.aread()).decode(errors="replace")[:500]
        raise BenchError(f"HTTP {response.status_code} from {CHAT_PATH}: {detail}")


def _finish(state: _StreamState, sent_at: float) -> StreamResult:
    if state.first_at is None or state.last_at is None:
        raise BenchError("the stream carried no content")
    # Without usage, one token per content delta: how servers that do not report it stream.
    usage = state.usage or {"completion_tokens": state.deltas}
    details = usage.get("prompt_tokens_details") or {}
    return StreamResult(
        sent_at=sent_at,
        first_at=state.first_at,
        last_at=state.last_at,
        text="".join(state.pieces),
        prompt_tokens=int(usage.get("prompt_tokens") or 0),
        completion_tokens=int(usage.get("completion_tokens") or 0),
        cached_tokens=details.get("cached_tokens"),
        gaps_s=state.gaps_s,
    )


@dataclass(slots=True, frozen=True)
class DecodeResult:
    """Single-stream decode speed: the tokens after the first, over the time from first to last."""

    completion_tokens: int
    decode_s: float

    @property
    def tok_s(self) -> float:
        return (self.completion_tokens - 1) / self.decode_s if self.decode_s > 0 else 0.0


@dataclass(slots=True, frozen=True)
class ConcurrentDecodeResult:
    """Several streams decoding at once: all their tokens after each stream's first, over the
    time from the first stream's first token to the last stream's last token."""

    streams: int
    completion_tokens: int  # summed over the streams
    decode_s: float

    @property
    def tok_s(self) -> float:
        decoded = self.completion_tokens - self.streams
        return decoded / self.decode_s if self.decode_s > 0 else 0.0


@dataclass(slots=True, frozen=True)
class PrefillResult:
    """Prefill speed of one fresh prompt: its tokens over the time to its first token."""

    prompt_tokens: int
    seconds: float

    @property
    def tok_s(self) -> float:
        return self.prompt_tokens / self.seconds if self.seconds > 0 else 0.0


@dataclass(slots=True, frozen=True)
class TurnResult:
    """One turn of one agent. Turn 0 is the agent's cold turn; later turns are warm."""

    agent: int
    turn: int
    ttft_s: float
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int | None

    @property
    def cold(self) -> bool:
        return self.turn == 0


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0–100) of a non-empty list, interpolating linearly between the
    closest ranks (numpy's default method)."""
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


@dataclass(slots=True, frozen=True)
class LatencySummary:
    """p50/p95 of a set of latencies in seconds; None when the set is empty."""

    count: int
    p50: float | None
    p95: float | None

    @classmethod
    def of(cls, values: list[float]) -> LatencySummary:
        if not values:
            return cls(0, None, None)
        return cls(len(values), percentile(values, 50), percentile(values, 95))


@dataclass(slots=True)
class WorkloadResult:
    """Every turn of the multi-agent workload and the wall time of the whole phase."""

    turns: list[TurnResult]
    wall_s: float

    @property
    def cold_ttft(self) -> LatencySummary:
        return LatencySummary.of([t.ttft_s for t in self.turns if t.cold])

    @property
    def warm_ttft(self) -> LatencySummary:
        return LatencySummary.of([t.ttft_s for t in self.turns if not t.cold])

    @property
    def completion_tokens(self) -> int:
        return sum(t.completion_tokens for t in self.turns)

    @property
    def output_tok_s(self) -> float:
        return self.completion_tokens / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def cache_hit_rate(self) -> float | None:
        """Share of prompt tokens the server served from its cache; None if it never says."""
        return cached_share(self.turns)


async def calibrate(client: httpx.AsyncClient, model: str, run_tag: str) -> float:
    """Tokens per word of `sentences()` text as the server counts them: two prompts that differ
    by `CALIBRATION_WORDS` words, so the chat template's own tokens cancel out."""
    counts: list[int] = []
    for words in (1, 1 + CALIBRATION_WORDS):
        text = f"Run {run_tag}, calibration. " + sentences(f"calibrate-{words}", words)
        session = f"bench-{run_tag}-calibrate-{words}"
        body = chat_body(model, [{"role": "user", "content": text}], 1, session)
        counts.append(
            (await stream_chat(client, body)).prompt_tokens
            or await _unstreamed_prompt_tokens(client, body)
        )
    # A server that reports nonsense must not make prompts empty or endless.
    return min(max((counts[1] - counts[0]) / CALIBRATION_WORDS, 0.25), 4.0)


async def _unstreamed_prompt_tokens(client: httpx.AsyncClient, body: dict[str, Any]) -> int:
    """The prompt's tokens from the usage of the same request unstreamed, which OpenAI's API
    always carries, for a server that streamed none."""
    unstreamed = {key: value for key, value in body.items() if key != "stream_options"}
    try:
        response = await client.post(CHAT_PATH, json=unstreamed | {"stream": False})
    except httpx.TransportError as exc:
        raise BenchError(f"{client.base_url}{CHAT_PATH}: {exc!r}") from exc
    await _check_status(response)
    try:
        return int(response.json()["usage"]["prompt_tokens"])
    except (ValueError, KeyError, TypeError) as exc:
        raise BenchError("the server reports no prompt_tokens, streamed or not") from exc


DECODE_RUNS = 3


async def measure_decode(client: httpx.AsyncClient, model: str, plan: BenchPlan) -> DecodeResult:
    """One request decoding `DECODE_TOKENS` tokens alone, `DECODE_RUNS` times: the run of median
    rate. A run lasts about a second, so one hiccup of the machine (or of this client, which
    shares it) would otherwise be the phase's whole result."""
    body = chat_body(model, plan.decode_messages, DECODE_TOKENS, f"bench-{plan.run_tag}-decode")
    runs = []
    for _ in range(DECODE_RUNS):
        reply = await stream_chat(client, body)
        if reply.completion_tokens < 2 or reply.last_at <= reply.first_at:
            raise BenchError(
                f"decode phase got {reply.completion_tokens} token(s); need at least 2"
            )
        runs.append(DecodeResult(reply.completion_tokens, reply.last_at - reply.first_at))
    return sorted(runs, key=lambda run: run.tok_s)[len(runs) // 2]


async def measure_concurrent_decode(
    client: httpx.AsyncClient, model: str, plan: BenchPlan
) -> ConcurrentDecodeResult:
    """One short prompt per agent, all sent at once, each decoding `DECODE_TOKENS` tokens."""
    replies = await asyncio.gather(
        *(
            stream_chat(
                client,
                chat_body(model, messages, DECODE_TOKENS, f"bench-{plan.run_tag}-concurrent-{i}"),
            )
            for i, messages in enumerate(plan.concurrent_messages)
        )
    )
    if any(reply.completion_tokens < 2 for reply in replies):
        raise BenchError("concurrent decode phase: a stream got fewer than 2 tokens")
    first = min(reply.first_at for reply in replies)
    last = max(reply.last_at for reply in replies)
    tokens = sum(reply.completion_tokens for reply in replies)
    return ConcurrentDecodeResult(len(replies), tokens, last - first)


async def measure_prefill(client: httpx.AsyncClient, model: str, plan: BenchPlan) -> PrefillResult:
    body = chat_body(model, plan.prefill_messages, 1, f"bench-{plan.run_tag}-prefill")
    reply = await stream_chat(client, body)
    return PrefillResult(reply.prompt_tokens, reply.ttft_s)


async def run_workload(
    client: httpx.AsyncClient, model: str, plan: BenchPlan, on_turn: Callable[[TurnResult], None]
) -> WorkloadResult:
    """All agents at once, each through its turns in order; wall time covers the whole phase."""
    started = time.perf_counter()
    per_agent = await asyncio.gather(
        *(_run_agent(client, model, script, plan.max_tokens, on_turn) for script in plan.agents)
    )
    wall_s = time.perf_counter() - started
    return WorkloadResult([turn for turns in per_agent for turn in turns], wall_s)


async def _run_agent(
    client: httpx.AsyncClient,
    model: str,
    script: AgentScript,
    max_tokens: int,
    on_turn: Callable[[TurnResult], None],
) -> list[TurnResult]:
    answers: list[str] = []
    results: list[TurnResult] = []
    for turn in range(len(script.users)):
        body = chat_body(model, script.messages(answers), max_tokens, script.session_id)
        reply = await stream_chat(client, body)
        answers.append(reply.text)
        result = TurnResult(
            agent=script.index,
            turn=turn,
            ttft_s=reply.ttft_s,
            prompt_tokens=reply.prompt_tokens,
            completion_tokens=reply.completion_tokens,
            cached_tokens=reply.cached_tokens,
        )
        on_turn(result)
        results.append(result)
    return results
