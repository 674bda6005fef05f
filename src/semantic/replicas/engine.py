"""The engine port over vLLM replicas: generation runs on vLLM OpenAI-compatible servers, and
this side keeps what the API layer needs of an engine (`engine/port.py`).

A request's prompt arrives as token ids rendered by our chat template; it goes to the replica
its agent is routed to (`router.py`), under its key's `cache_salt` (vLLM's per-tenant prefix
cache namespace, keyed by the server's secret), and the replica's token ids come back through
our own detokenizer and stop matcher, so the text, stop strings and finish reasons read as
they do on our engine. A replica that cannot be reached is taken out and the request retried
on the next one; one that fails `/health` is taken out until it answers again, its agents
moving to their next replica (one whose `/health` only times out, as a busy replica's may, after
a few checks in a row). A replica joins the routing once its `/health` and `/v1/models` have
answered, so every prompt is checked against the length it takes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from semantic.core import FinishReason, Request, TokenEvent, Usage
from semantic.engine.port import Capabilities
from semantic.errors import (
    ContextOverflow,
    EngineFailure,
    InvalidRequest,
    NotSupported,
    Unavailable,
)
from semantic.models.served import ServedModel
from semantic.observability import VLLM_METRICS, EngineMetrics, ReplicaReading, ReplicasReading
from semantic.replicas.client import (
    SLOW_CHECKS_TOLERATED,
    ReplicaClient,
    ReplicaDown,
    completion_body,
)
from semantic.replicas.http import Opener, open_tcp
from semantic.replicas.router import NoReplica, Replica, Router, routing_key
from semantic.server_key import ServerKey
from semantic.text.detokenizer import IncrementalDetokenizer, StopMatcher

if TYPE_CHECKING:
    from semantic.engine.agent_door import AgentDoor

log = logging.getLogger(__name__)

Sink = Callable[[TokenEvent], None]

_SALT_DOMAIN = b"semantic vllm cache salt 1\0"  # a tag made for this and nothing else
# A grammar our grammar engine (llguidance) compiled, and the replica's backend could not:
# vLLM 0.32 fails such a request before its first token with a bare "Internal server error"
# (xgrammar, its default, refuses some patterns llguidance takes, e.g. `\p{L}`). The request,
# not the server, is what fails there: a 400, with the cure.
_UNCOMPILED = (
    "the vLLM replica could not compile the request's grammar (a JSON schema or a forced tool "
    "call) and failed it before its first token ({}); its structured-output backend does not "
    "take every grammar semantic does: simplify the schema (patterns, formats), or run the "
    "replicas with `--structured-outputs-config.backend guidance`"
)
_FINISH = {"stop": FinishReason.STOP, "length": FinishReason.LENGTH, "abort": FinishReason.ABORT}


@dataclass(slots=True)
class _Output:
    """What one request has produced so far: its tokens, and the text machinery over them."""

    detokenizer: IncrementalDetokenizer
    stops: StopMatcher
    token_ids: list[int] = field(default_factory=list)
    usage: dict[str, Any] | None = None  # vLLM's, from the stream's last chunk
    finish: str | None = None


class ReplicaEngine:
    """Serves `model` on the replicas `router` knows. Used on the event loop's thread only.
    `server_key` keys each API key's `cache_salt` (the same key makes the same salts, so vLLM's
    prefix cache stays warm across our restarts).

    Each request runs as a task that feeds its events to a queue (`stream` reads it); aborting
    a request cancels its task, which closes the HTTP stream, and vLLM aborts on that.
    """

    capabilities = Capabilities(
        agents=False, swap=False, cache_miss=False, structured_output=True, logprobs=False
    )
    down_reason = "no vLLM replica is healthy"

    def __init__(
        self,
        model: ServedModel,
        router: Router,
        server_key: ServerKey,
        *,
        share_across_keys: bool = False,
        health_interval_s: float = 5.0,
        opener: Opener = open_tcp,
    ) -> None:
        self.model = model
        self.router = router
        self.metrics = EngineMetrics()
        self._server_key = server_key
        self._share_across_keys = share_across_keys
        self._health_interval_s = health_interval_s
        self._opener = opener  # the network, or a test's stand-in
        self._client: ReplicaClient | None = None
        self._watcher: asyncio.Task[None] | None = None
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._refusal: Exception | None = None  # set by `cancel_all`: every request fails so
        self._hit_tokens = 0  # prompt tokens the replicas' usage reported cached
        self._miss_tokens = 0  # and computed

    # -- lifetime ---------------------------------------------------------------------------

    def start(self) -> None:
        if self._client is not None:
            raise RuntimeError("an engine starts once")
        self._client = ReplicaClient(self._opener)
        self._watcher = asyncio.get_running_loop().create_task(self._watch())

    def stop(self, timeout: float = 60.0) -> None:
        """Cancel what runs (vLLM keeps its own caches; there is nothing of ours to persist)."""
        for task in [self._watcher, *self._tasks.values()]:
            if task is not None:
                task.cancel()
        client, self._client = self._client, None
        if client is not None:
            with contextlib.suppress(RuntimeError):  # no loop left to close it on
                asyncio.get_running_loop().create_task(client.close())

    @property
    def max_seq_tokens(self) -> int:
        """Our model's context, or the shortest `--max-model-len` among the replicas that have
        said theirs, if shorter: any of them may take a request, and vLLM refuses a sequence
        longer than its own; checked here, a long prompt gets the protocol's context-overflow
        answer (what Claude Code compacts on) and `max_tokens` is cut to the room left."""
        lengths = [r.max_model_len for r in self.router.replicas if r.max_model_len is not None]
        return min([self.model.context_length, *lengths])

    @property
    def alive(self) -> bool:
        return self._client is not None and any(r.healthy for r in self.router.replicas)

    @property
    def agent_door(self) -> AgentDoor:
        raise NotSupported(
            "the agent API (server-kept conversations, forks, pin, persist, evict and "
            "per-agent cache statistics) is not available on the vLLM engine"
        )

    # -- requests ---------------------------------------------------------------------------

    def stream(self, request: Request, *, announce: bool = False) -> AsyncIterator[TokenEvent]:
        """As `EnginePort.stream`. Raises at once for a request no replica could run."""
        prompt_tokens = len(request.prompt_token_ids)
        if prompt_tokens == 0:
            raise InvalidRequest("the prompt is empty")
        if prompt_tokens >= self.max_seq_tokens:
            raise ContextOverflow(prompt_tokens, 0, self.max_seq_tokens)
        return self._events(request, announce)

    async def _events(self, request: Request, announce: bool) -> AsyncIterator[TokenEvent]:
        events: asyncio.Queue[TokenEvent] = asyncio.Queue()
        request_id = request.request_id
        task = asyncio.get_running_loop().create_task(self._run(request, events.put_nowait))
        self._tasks[request_id] = task
        finished = False
        try:
            if announce:
                yield TokenEvent(request_id, [], "")
            while not finished:
                event = await events.get()
                finished = event.final
                yield event
        finally:
            task.cancel()  # a client that went away: closes the replica's stream
            self._tasks.pop(request_id, None)

    def abort(self, request_id: str) -> None:
        task = self._tasks.get(request_id)
        if task is not None:
            task.cancel()

    def progress(self, request_id: str) -> tuple[int, int] | None:
        return None  # vLLM does not say how far a prefill is

    async def cancel_all(self, error: Exception) -> int:
        self._refusal = error
        running = list(self._tasks.values())
        for task in running:
            task.cancel()
        return len(running)

    # -- what the API shows -----------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        replicas = self.router.replicas
        return {
            "running": sum(r.in_flight for r in replicas),
            "replicas": [
                {
                    "url": r.url,
                    "healthy": r.healthy,
                    "in_flight": r.in_flight,
                    "routed": r.routed,
                    "spilled": r.spilled,
                    "model": r.model_id,
                }
                for r in replicas
            ],
        }

    def cache_spec_tag(self) -> str | None:
        return None  # the KV cache is vLLM's

    async def reading(self) -> ReplicasReading | None:
        """Each replica's routing and health, with what its own /metrics says (the healthy
        ones', read at once); the prompt tokens the replicas reported cached and computed."""
        client = self._client
        if client is None:
            return None
        replicas = self.router.replicas
        scraped = await asyncio.gather(
            *(client.scraped(r, VLLM_METRICS) if r.healthy else _nothing() for r in replicas)
        )
        return ReplicasReading(
            model=self.model.name,
            hit_tokens=self._hit_tokens,
            miss_tokens=self._miss_tokens,
            replicas=[
                ReplicaReading(r.url, r.healthy, r.in_flight, r.routed, r.spilled, values)
                for r, values in zip(replicas, scraped, strict=True)
            ],
        )

    # -- one request ------------------------------------------------------------------------

    async def _run(self, request: Request, sink: Sink) -> None:
        output = _Output(
            IncrementalDetokenizer(self.model.tokenizer), StopMatcher(request.sampling.stop)
        )
        try:
            if self._refusal is not None:
                raise self._refusal
            finish, stop_string = await self._generate(request, output, sink)
            final = self._final(request, output, finish, stop_string=stop_string)
            if final.usage is not None and output.usage is not None:  # the replica's own count
                self._hit_tokens += final.usage.cached_tokens
                self._miss_tokens += final.usage.prompt_tokens - final.usage.cached_tokens
            sink(final)
        except asyncio.CancelledError:
            sink(self._final(request, output, FinishReason.ABORT, error=self._refusal))
            raise
        except NoReplica as exc:
            sink(self._final(request, output, FinishReason.ERROR, error=Unavailable(str(exc))))
        except Exception as exc:  # the replica's refusal or failure: this request's only
            log.warning("request %s failed on vLLM: %s", request.request_id, exc)
            sink(self._final(request, output, FinishReason.ERROR, error=exc))

    async def _generate(
        self, request: Request, output: _Output, sink: Sink
    ) -> tuple[FinishReason, str | None]:
        """Run `request` on its replica; on one that is down before it answered, on the next.
        Returns how it finished and the stop string that ended it, if one did."""
        key = routing_key(request)
        while True:
            replica = self.router.route(key)
            try:
                return await self._on(replica, request, output, sink)
            except ReplicaDown as exc:
                self._take_out(replica, str(exc))
                if output.token_ids:  # the client has part of an answer: it cannot restart
                    raise Unavailable(f"the vLLM replica went away mid-answer: {exc}") from exc
            finally:
                self.router.done(replica)

    async def _on(
        self, replica: Replica, request: Request, output: _Output, sink: Sink
    ) -> tuple[FinishReason, str | None]:
        client = self._client
        if client is None:
            raise Unavailable("the engine is not running")
        model_id = replica.model_id or await client.read_model(replica)
        body = completion_body(request, model_id, self._salt(request), self._ends)
        stop_string: str | None = None
        try:
            async with client.completions(replica, body) as chunks:
                async for chunk in chunks:
                    if chunk.get("usage"):
                        output.usage = chunk["usage"]
                    for choice in chunk.get("choices") or []:
                        output.finish = choice.get("finish_reason") or output.finish
                        # Past our stop string, read on (vLLM stops on it too) for the usage.
                        if stop_string is None:
                            token_ids = choice.get("token_ids") or []
                            stop_string = self._tokens(request, output, token_ids, sink)
        except EngineFailure as exc:
            if "structured_outputs" in body and not output.token_ids:
                raise InvalidRequest(_UNCOMPILED.format(exc)) from exc
            raise
        if stop_string is not None:
            return FinishReason.STOP, stop_string
        return _FINISH.get(output.finish or "stop", FinishReason.STOP), None

    def _tokens(
        self, request: Request, output: _Output, token_ids: list[int], sink: Sink
    ) -> str | None:
        """Publish a chunk's tokens with their text, up to a stop string; the stop string, if
        one appeared (vLLM stops on it too, a few tokens later at most)."""
        params, ends = request.sampling, self._ends
        if token_ids and not output.token_ids:
            self.metrics.first_token(request)
        taken: list[int] = []
        text, stop_string = "", None
        for token in token_ids:
            taken.append(token)
            if token in params.stop_token_ids or (token in ends and not params.ignore_eos):
                continue  # an end token has no text (our engine's rule too)
            delta, stop_string = output.stops.feed(output.detokenizer.push(token))
            text += delta
            if stop_string is not None:
                break
        output.token_ids += taken
        self.metrics.generated_tokens.inc(len(taken))
        if taken:
            sink(TokenEvent(request.request_id, taken, text))
        return stop_string

    def _final(
        self,
        request: Request,
        output: _Output,
        reason: FinishReason,
        *,
        stop_string: str | None = None,
        error: Exception | None = None,
    ) -> TokenEvent:
        """The request's last event: the text held back, its finish and usage."""
        text = "" if stop_string is not None or error is not None else _rest(output)
        usage = output.usage or {}
        details = usage.get("prompt_tokens_details") or {}
        counted = Usage(
            prompt_tokens=int(usage.get("prompt_tokens", len(request.prompt_token_ids))),
            completion_tokens=int(usage.get("completion_tokens", len(output.token_ids))),
            cached_tokens=int(details.get("cached_tokens") or 0),
        )
        return TokenEvent(request.request_id, [], text, reason, counted, error, stop_string)

    @property
    def _ends(self) -> frozenset[int]:
        return self.model.tokenizer.eos_token_ids

    def _salt(self, request: Request) -> str | None:
        """The key's prefix-cache namespace on vLLM: a key's cached prompts hit only for that
        key, as on our engine, unless the keys share (`share_cache_across_keys`). A server
        without keys has one tenant, and no salt. Keyed by the server's secret: whoever
        reaches a replica directly cannot compute a key's salt from its owner digest, and so
        cannot probe that key's cached prompts."""
        if self._share_across_keys or request.owner is None:
            return None
        return self._server_key.tag(_SALT_DOMAIN, request.owner.encode())[:16].hex()

    # -- replica health ---------------------------------------------------------------------

    async def _watch(self) -> None:
        """Check every replica's `/health` every `health_interval_s`, for the engine's life."""
        while True:
            await asyncio.gather(*(self._check(r) for r in self.router.replicas))
            await asyncio.sleep(self._health_interval_s)

    async def _check(self, replica: Replica) -> None:
        client = self._client
        if client is None:
            return
        health = await client.health(replica)
        if health == "slow" and replica.healthy:
            replica.slow_checks += 1
            if replica.slow_checks < SLOW_CHECKS_TOLERATED:
                log.info("vLLM replica %s is slow to answer /health: busy, kept", replica.url)
                return
        replica.slow_checks = 0
        healthy = health == "up"
        if healthy and replica.model_id is None:
            try:
                await client.read_model(replica)
            except ReplicaDown as exc:
                healthy = False
                log.warning("vLLM replica %s: %s", replica.url, exc)
        if not healthy:
            self._take_out(replica, f"its health check: {health}")
        elif self.router.mark(replica, True):
            log.info("vLLM replica %s is healthy: its agents route to it", replica.url)

    def _take_out(self, replica: Replica, why: str) -> None:
        replica.model_id = None  # read again when it is back: it may serve under another name
        if self.router.mark(replica, False):
            log.warning(
                "vLLM replica %s is out of the routing (%s): its agents move to their next replica",
                replica.url,
                why,
            )


async def _nothing() -> dict[str, float]:
    return {}  # a replica out of the routing is not asked


def _rest(output: _Output) -> str:
    """The text held back for lack of context (a partial character or stop string), when the
    answer ends without a stop string."""
    text, stop_string = output.stops.feed(output.detokenizer.flush())
    return text if stop_string is not None else text + output.stops.flush()
