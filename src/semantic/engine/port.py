"""The engine port: everything the API layer asks of an engine, and nothing more.

Two engines stand behind it: ours (`engine/engine.py`: our scheduler, block pool, agent store
and disk tier, on this machine) and one over vLLM replicas (`replicas/engine.py`: vLLM's own
scheduler and prefix cache, over HTTP). What the second cannot do is said by `Capabilities`,
and an API route that needs a missing capability answers `NotSupported` (501, in its protocol's
shape) instead of failing somewhere deeper.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from semantic.core import Request, TokenEvent
from semantic.errors import NotSupported

if TYPE_CHECKING:
    from semantic.engine.agent_door import AgentDoor
    from semantic.models.served import ServedModel
    from semantic.observability import EngineMetrics, EngineReading, ReplicasReading


@dataclass(slots=True, frozen=True)
class Capabilities:
    """What an engine can do beyond generating. Each flag names the API surface it gates.

    `agents`: the direct agent API (server-kept conversations, forks sharing KV, pin,
    per-agent statistics) and the admin cache routes, all through `EnginePort.agent_door`.
    `swap`: loading another model in place (`/admin/models/swap`).
    `cache_miss`: saying where and why a prompt missed the cache (the miss header).
    `structured_output`: constraining the output to a grammar (JSON schema, strict tools).
    `logprobs`: the sampled tokens' log probabilities (`SamplingParams.logprobs`).
    """

    agents: bool
    swap: bool
    cache_miss: bool
    structured_output: bool
    logprobs: bool

    def require(self, capability: str, what: str) -> None:
        """Raise `NotSupported` naming `what` unless the engine has `capability`."""
        if not getattr(self, capability):
            raise NotSupported(f"{what} is not available on this server's engine")


class EnginePort(Protocol):
    """An engine as the API layer sees it. Called from the event loop's thread only.

    `model` is our tokenizer and chat template for the served model: every engine gets prompts
    as token ids rendered by them, so a prompt is the same bytes whichever engine runs it.
    `max_seq_tokens` is the longest sequence (prompt + output) one request may have.
    `metrics` is lent by the host (`engine/host.py`) and outlives the engine.
    """

    metrics: EngineMetrics

    @property
    def model(self) -> ServedModel: ...

    @property
    def max_seq_tokens(self) -> int: ...

    @property
    def capabilities(self) -> Capabilities: ...

    @property
    def alive(self) -> bool:
        """Whether the engine can take a request now (our engine's thread runs; some vLLM
        replica is healthy). `/health/ready` says 503 while it is false."""
        ...

    @property
    def down_reason(self) -> str:
        """What `/health/ready` says while `alive` is false."""
        ...

    @property
    def agent_door(self) -> AgentDoor:
        """The agent API's one way in (`engine/agent_door.py`); `NotSupported` unless
        `capabilities.agents`."""
        ...

    def start(self) -> None:
        """Start serving (on the event loop that serves the app); once."""

    def stop(self, timeout: float = 60.0) -> None:
        """Stop: end what runs and persist what the engine keeps."""

    def stream(self, request: Request, *, announce: bool = False) -> AsyncIterator[TokenEvent]:
        """Submit `request` and return its events, the last with `finish_reason` and `usage`
        (or `error`). Raises at once if it can never run. Closing the iterator early aborts
        the request. With `announce`, a first event without tokens comes once the engine has
        taken the request in (carrying its `cache_miss`, where the engine knows it)."""
        ...

    def abort(self, request_id: str) -> None:
        """End a request early: its stream finishes with `FinishReason.ABORT`."""

    def progress(self, request_id: str) -> tuple[int, int] | None:
        """(prompt tokens with KV, prompt tokens) of a request in prefill, for the heartbeat
        of a long prefill; None when unknown or done."""
        ...

    async def cancel_all(self, error: Exception) -> int:
        """Fail every request in flight with `error`, and every one submitted from now on (a
        shutdown's or a swap's end). Returns how many it failed."""
        ...

    def state(self) -> dict[str, Any]:
        """What `/health/ready` and `/admin/cache` show of the engine: our pool's block counts,
        or the replicas' health and load."""
        ...

    def cache_spec_tag(self) -> str | None:
        """The KV cache geometry the engine's caches are cut for (`/admin/models`); None when
        the cache is not ours."""
        ...

    async def reading(self) -> EngineReading | ReplicasReading | None:
        """The engine's state for a metrics scrape (`observability.py`), or None when it has
        none to give now."""
        ...
