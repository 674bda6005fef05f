"""Logging setup and the metrics catalog: every log line and every metric the server emits.

Logs: stdlib `logging` records (ours, uvicorn's) and structlog events go through one structlog
pipeline, as JSON lines when the stream is not a terminal and as readable lines when it is. A
request's lines carry its `request_id` and `agent_id`, bound by the API (`bind_request`,
`bind_agent`) in a context variable; the engine thread, which context variables do not reach,
passes them explicitly (`request_fields`).

Metrics: Prometheus, one `CollectorRegistry` per app. Three sources: the HTTP layer counts
requests (`Metrics.request_done`); the engine counts what happens as it happens in a few cheap
hooks (`EngineMetrics`); everything else (pool, queue, cache, agents) is read on the engine
thread at scrape time (`read_engine`) and never kept twice. docs/operations.md lists them all.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable, Iterable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, TextIO

import structlog
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector
from structlog.typing import EventDict

from semantic.cache.pages.block_pool import (
    TIER_IDLE_AGENT,
    TIER_ONE_OFF,
    TIER_OUT_OF_WINDOW,
    TIER_SHARED,
    TIER_WORKING_AGENT,
)
from semantic.core import Batch, Request, Sequence, StepToken
from semantic.engine.snapshot import EngineSnapshot

# -- logs ------------------------------------------------------------------------------------

_log = logging.getLogger("semantic.engine")


def configure_logging(
    level: str, stream: TextIO | None = None, as_json: bool | None = None
) -> logging.Handler:
    """Send every log record at `level` or above to `stream` (stderr): JSON lines unless it is
    a terminal (or `as_json` says otherwise). Replaces the handler an earlier call installed;
    returns the new one."""
    stream = sys.stderr if stream is None else stream
    as_json = not stream.isatty() if as_json is None else as_json
    shared: list[Any] = [
        _add_request_fields,
        structlog.stdlib.add_logger_name,
        structlog.stdlib.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    renderer: list[Any] = (
        [structlog.processors.format_exc_info, structlog.processors.JSONRenderer()]
        if as_json
        # no locals in tracebacks: they may hold a key
        else [
            structlog.dev.ConsoleRenderer(
                colors=stream.isatty(), exception_formatter=_CONSOLE_TRACEBACKS
            )
        ]
    )
    structlog.configure(
        processors=[*shared, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )
    handler = _Handler(stream)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            # a stdlib record's `extra=` fields (the engine's request ids) become keys
            foreign_pre_chain=[*shared, structlog.stdlib.ExtraAdder(), _drop_formatting],
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, *renderer],
        )
    )
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _Handler)]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    # httpx logs every request at info: the vLLM engine's health checks, every few seconds.
    logging.getLogger("httpx").setLevel(max(root.level, logging.WARNING))
    logging.captureWarnings(True)  # `warnings` too, as lines of the `py.warnings` logger
    return handler


_CONSOLE_TRACEBACKS = structlog.dev.RichTracebackFormatter(show_locals=False)


class _Handler(logging.StreamHandler[TextIO]):
    """Ours, so that configuring again replaces it and leaves other handlers alone."""


def _drop_formatting(_: Any, __: str, event: EventDict) -> EventDict:
    """Attributes that are no `extra=` field: what other formatters left on a record
    (`message`, `asctime`), and the ANSI-coloured copy of a message uvicorn adds."""
    for key in ("message", "asctime", "color_message"):
        event.pop(key, None)
    return event


# The ids of the request being served, one dict per request. `bind_agent` writes into the dict
# rather than setting the variable: the route runs in a copy of the request's context
# (Starlette's `call_next` starts a task), and a variable set there would never reach the lines
# logged outside it once the route returns, such as uvicorn's access line or a 500's.
_request_fields: ContextVar[dict[str, str] | None] = ContextVar("request_fields", default=None)


def bind_request(request_id: str) -> None:
    """From here on, this request's log lines carry its id (called first thing per request)."""
    _request_fields.set({"request_id": request_id})


def bind_agent(agent_id: str | None) -> None:
    """From here on, this request's log lines carry the agent it names (when it names one), the
    lines logged before the route returns and after."""
    fields = _request_fields.get()
    if agent_id is not None and fields is not None:
        fields["agent_id"] = agent_id


def _add_request_fields(_: Any, __: str, event: EventDict) -> EventDict:
    for key, value in (_request_fields.get() or {}).items():
        event.setdefault(key, value)
    return event


def request_fields(request: Request) -> dict[str, str]:
    """A request's ids as `extra=` for a line the engine thread logs about it."""
    fields = {"request_id": request.request_id}
    if request.agent_id is not None:
        fields["agent_id"] = request.agent_id
    return fields


class PrefillProgress:
    """Log lines for a long prefill, which shows nothing else until its first token: a prompt
    with at least `min_tokens` tokens to compute (past its cached ones) logs how far it is every
    `every_s` seconds, and its rate once done. Fed the running sequences after each step, on the
    engine thread."""

    def __init__(
        self,
        min_tokens: int = 2048,
        every_s: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.min_tokens = min_tokens
        self.every_s = every_s
        self._clock = clock
        self._tracked: dict[int, _Prefill] = {}  # by seq_id

    def stepped(self, running: Iterable[Sequence]) -> None:
        now, seen = self._clock(), set()
        for seq in running:
            seen.add(seq.seq_id)
            tracked = self._tracked.get(seq.seq_id)
            if tracked is None and seq.in_prefill:
                if seq.num_prompt_tokens - seq.num_cached_tokens >= self.min_tokens:
                    self._tracked[seq.seq_id] = _Prefill(started=now, logged=now)
            elif tracked is not None and not seq.in_prefill:
                _log_prefill(seq, "prefill done", now - tracked.started)
                del self._tracked[seq.seq_id]
            elif tracked is not None and now - tracked.logged >= self.every_s:
                _log_prefill(seq, "prefill", now - tracked.started)
                tracked.logged = now
        for gone in self._tracked.keys() - seen:  # finished, aborted or preempted
            del self._tracked[gone]


@dataclass(slots=True)
class _Prefill:
    started: float
    logged: float


def _log_prefill(seq: Sequence, event: str, elapsed: float) -> None:
    done = min(seq.num_computed_tokens, seq.num_prompt_tokens) - seq.num_cached_tokens
    total = seq.num_prompt_tokens - seq.num_cached_tokens
    _log.info(
        "%s: %s of %s tokens (%d%%) in %.1f s, %.0f tokens/s",
        event,
        f"{done:,}",
        f"{total:,}",
        100 * done // max(total, 1),
        elapsed,
        done / max(elapsed, 1e-9),
        extra=request_fields(seq.request),
    )


# -- metrics counted as they happen ----------------------------------------------------------

SECONDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
SLOW_SECONDS = (0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
COUNTS = tuple(2.0**i for i in range(14))  # 1 … 8192


class EngineMetrics:
    """What the engine counts as it happens. Prometheus objects lock inside, so the engine
    thread observes and the event loop collects without a message between them. Registered in
    no registry of their own: each app's registry takes them in (`Metrics`)."""

    def __init__(self) -> None:
        self.time_to_first_token = Histogram(
            "semantic_time_to_first_token_seconds",
            "From a request's arrival at the engine (its prompt tokenized) to its first token.",
            buckets=SECONDS,
            registry=None,
        )
        self.step_sequences = Histogram(
            "semantic_step_sequences",
            "Sequences in one engine step (the batch size).",
            buckets=COUNTS,
            registry=None,
        )
        self.step_tokens = Histogram(
            "semantic_step_tokens",
            "Tokens computed in one engine step: one per decode, plus prefill chunks.",
            buckets=COUNTS,
            registry=None,
        )
        self.generated_tokens = Counter(
            "semantic_generated_tokens",
            "Tokens sampled; rate() of it is the server's tokens/s.",
            registry=None,
        )
        # Speculative decoding: accepted / drafted is the acceptance rate.
        self.draft_tokens = Counter(
            "semantic_draft_tokens",
            "Draft tokens verified (speculative decoding, drafts from the context).",
            registry=None,
        )
        self.draft_accepted_tokens = Counter(
            "semantic_draft_accepted_tokens",
            "Draft tokens the model accepted: each one a token gained without a step of its own.",
            registry=None,
        )
        # Observed by the model host (engine/host.py) once per swap: from its start to the new
        # model serving, or the old one again when the new one failed to load.
        self.model_swap_duration = Histogram(
            "semantic_model_swap_duration_seconds",
            "Model swaps, from the request to a model serving again.",
            buckets=SLOW_SECONDS,
            registry=None,
        )
        self.cache_persist_duration = Histogram(
            "semantic_cache_persist_duration_seconds",
            "Cache persists (/admin/cache/persist, agent persist), from the request to fsynced.",
            buckets=SECONDS,
            registry=None,
        )

    def collectors(self) -> list[Collector]:
        return [
            self.time_to_first_token,
            self.step_sequences,
            self.step_tokens,
            self.generated_tokens,
            self.draft_tokens,
            self.draft_accepted_tokens,
            self.model_swap_duration,
            self.cache_persist_duration,
        ]

    def stepped(self, batch: Batch, sampled: int, tokens: Iterable[StepToken] = ()) -> None:
        """A step ran `batch`, the runner gave `tokens` (a verified draft's as a list: its
        accepted tokens and one more), and `sampled` of them went to their requests."""
        self.step_sequences.observe(len(batch.items))
        self.step_tokens.observe(sum(len(item.token_ids) for item in batch.items))
        self.generated_tokens.inc(sampled)
        drafted = sum(len(item.draft_token_ids) for item in batch.items)
        if drafted:
            self.draft_tokens.inc(drafted)
            self.draft_accepted_tokens.inc(sum(len(t) - 1 for t in tokens if isinstance(t, list)))

    def first_token(self, request: Request) -> None:
        self.time_to_first_token.observe(time.monotonic() - request.arrival_time)


# -- metrics read at scrape time -------------------------------------------------------------

EVICTION_TIERS = {
    TIER_OUT_OF_WINDOW: "out_of_window",
    TIER_ONE_OFF: "one_off",
    TIER_IDLE_AGENT: "idle_agent",
    TIER_WORKING_AGENT: "working_agent",
    TIER_SHARED: "shared",
}


@dataclass(frozen=True, slots=True)
class EngineReading:
    """The engine's state as /metrics shows it, taken between steps."""

    model: str
    running: int
    waiting: int
    blocks: dict[str, int]  # held, cached, free
    kv_pool_bytes: int
    reclaimed: dict[str, int]  # cached blocks the pool reclaimed, by eviction tier
    cache: dict[str, Any]  # `CacheStats.totals()`, the same numbers /admin/cache shows
    agents_active: int
    agents_idle: int
    preemptions: int

    def families(self) -> Iterable[Metric]:
        return _reading_families(self)


def read_engine(snapshot: EngineSnapshot) -> EngineReading:
    """The reading /metrics shows, from what the engine published (`Engine.snapshot`)."""
    stats = snapshot.stats
    return EngineReading(
        model=snapshot.model,
        running=stats.running,
        waiting=stats.waiting,
        blocks={
            "held": stats.blocks_held,
            "cached": stats.blocks_cached,
            "free": stats.blocks_free,
        },
        kv_pool_bytes=stats.blocks_total * snapshot.bytes_per_page,
        reclaimed={name: snapshot.reclaimed[tier] for tier, name in EVICTION_TIERS.items()},
        cache=dict(snapshot.cache),
        agents_active=snapshot.agents_active,
        agents_idle=snapshot.agents_idle,
        preemptions=snapshot.preemptions,
    )


@dataclass(frozen=True, slots=True)
class ReplicaReading:
    """One vLLM replica as the engine over vLLM sees it (`replicas/router.py`), and what its
    own /metrics said (`scraped`: vLLM's values by our name; empty when it did not answer)."""

    url: str
    healthy: bool
    in_flight: int
    routed: int
    spilled: int
    scraped: dict[str, float]


@dataclass(frozen=True, slots=True)
class ReplicasReading:
    """The engine over vLLM replicas as /metrics shows it: the prompt tokens the replicas'
    usage reported cached (`hit_tokens`) and computed (`miss_tokens`), and each replica."""

    model: str
    hit_tokens: int
    miss_tokens: int
    replicas: list[ReplicaReading]

    def families(self) -> Iterable[Metric]:
        return _replicas_families(self)


# What the engine over vLLM reads from each replica's /metrics: vLLM's name → ours. vLLM's
# samples are summed over their labels (its model and engine index).
VLLM_METRICS = {
    "vllm:num_requests_running": "running",
    "vllm:num_requests_waiting": "waiting",
    "vllm:kv_cache_usage_perc": "kv_cache_usage",
    "vllm:prefix_cache_queries_total": "prefix_cache_queried",
    "vllm:prefix_cache_hits_total": "prefix_cache_hit",
}


def _replicas_families(reading: ReplicasReading) -> Iterable[Metric]:
    replicas = reading.replicas
    yield _gauge("semantic_model_info", "The model served.", {reading.model: 1}, "model")
    yield _gauge(
        "semantic_requests_running",
        "Requests sent to a replica and not yet ended.",
        sum(r.in_flight for r in replicas),
    )
    scraped = [r.scraped for r in replicas if r.scraped]
    if scraped:
        waiting = sum(s.get("waiting", 0) for s in scraped)
        yield _gauge("semantic_requests_waiting", "Requests the replicas queue.", waiting)
    hits = {"memory": reading.hit_tokens}
    yield _counter("semantic_cache_hit_tokens", "Prompt tokens from cache.", hits, "tier")
    yield _counter("semantic_cache_miss_tokens", "Prompt tokens prefilled.", reading.miss_tokens)

    def by_url(read: Callable[[ReplicaReading], float]) -> dict[str, float]:
        return {r.url: read(r) for r in replicas}

    yield _gauge(
        "semantic_replica_healthy",
        "1 while a vLLM replica is in the routing.",
        by_url(lambda r: int(r.healthy)),
        "replica",
    )
    yield _gauge(
        "semantic_replica_in_flight",
        "Requests sent to a vLLM replica and not yet ended.",
        by_url(lambda r: r.in_flight),
        "replica",
    )
    yield _counter(
        "semantic_replica_routed_requests",
        "Requests routed to a vLLM replica (spilled ones included).",
        by_url(lambda r: r.routed),
        "replica",
    )
    yield _counter(
        "semantic_replica_spilled_requests",
        "Requests sent to a vLLM replica because their own one was saturated.",
        by_url(lambda r: r.spilled),
        "replica",
    )
    yield from _scraped_families(replicas)


def _scraped_families(replicas: list[ReplicaReading]) -> Iterable[Metric]:
    """What each replica's own /metrics said, for the replicas that answered."""
    answered = [r for r in replicas if r.scraped]
    if not answered:
        return
    requests = GaugeMetricFamily(
        "semantic_replica_requests",
        "A vLLM replica's requests by state, from its /metrics.",
        labels=["replica", "state"],
    )
    usage = GaugeMetricFamily(
        "semantic_replica_kv_cache_usage_ratio",
        "The share of a vLLM replica's KV cache in use, from its /metrics.",
        labels=["replica"],
    )
    prefix = CounterMetricFamily(
        "semantic_replica_prefix_cache_tokens",
        "Prompt tokens a vLLM replica looked up in its prefix cache, and found, from its /metrics.",
        labels=["replica", "outcome"],
    )
    for r in answered:
        for state in ("running", "waiting"):
            requests.add_metric([r.url, state], r.scraped.get(state, 0))
        usage.add_metric([r.url], r.scraped.get("kv_cache_usage", 0))
        prefix.add_metric([r.url, "queried"], r.scraped.get("prefix_cache_queried", 0))
        prefix.add_metric([r.url, "hit"], r.scraped.get("prefix_cache_hit", 0))
    yield from (requests, usage, prefix)


def _reading_families(reading: EngineReading) -> Iterable[Metric]:
    cache = reading.cache
    yield _gauge("semantic_model_info", "The model served.", {reading.model: 1}, "model")
    yield _gauge("semantic_requests_running", "Requests being computed.", reading.running)
    yield _gauge("semantic_requests_waiting", "Requests queued for pool room.", reading.waiting)
    yield _gauge("semantic_pool_blocks", "KV pool blocks by state.", reading.blocks, "state")
    yield _gauge("semantic_kv_pool_bytes", "Memory of the KV pool.", reading.kv_pool_bytes)
    hits = {"memory": cache["hit_tokens_memory"], "disk": cache["hit_tokens_disk"]}
    yield _counter("semantic_cache_hit_tokens", "Prompt tokens from cache.", hits, "tier")
    yield _counter("semantic_cache_miss_tokens", "Prompt tokens prefilled.", cache["miss_tokens"])
    yield _counter(
        "semantic_cache_miss_requests",
        "Requests whose reusable history was not all found, by why.",
        cache["miss_reasons"],
        "reason",
    )
    evicted = {
        "memory": sum(reading.reclaimed.values()) + cache["evicted_on_request"],
        "disk": cache["evicted_from_disk"],
    }
    yield _counter(
        "semantic_cache_evicted_blocks",
        "Blocks dropped from a tier, for room or by /admin/cache/evict.",
        evicted,
        "tier",
    )
    yield _counter(
        "semantic_pool_evicted_blocks",
        "Blocks dropped from memory, by eviction tier.",
        reading.reclaimed,
        "eviction_tier",
    )
    written = {
        "eviction": cache["evicted_to_disk"],
        "persist": cache["persisted"],
        "write_behind": cache["written_behind"],
    }
    yield _counter("semantic_cache_written_blocks", "Blocks written to disk.", written, "reason")
    yield _counter(
        "semantic_cache_restored_blocks", "Blocks read back from disk.", cache["restored"]
    )
    yield _counter(
        "semantic_cache_write_errors", "Block writes that failed.", cache["write_errors"]
    )
    yield _counter(
        "semantic_preemptions",
        "Running requests taken out for room, to resume from their cache.",
        reading.preemptions,
    )
    yield _gauge("semantic_cache_disk_bytes", "Disk used by KV blocks.", cache["disk_bytes"])
    yield _gauge("semantic_cache_disk_files", "KV block files on disk.", cache["disk_files"])
    yield _counter(
        "semantic_cache_quarantined_files",
        "Block files that failed a check and were set aside, by why.",
        cache["quarantined"],
        "reason",
    )
    agents = {"active": reading.agents_active, "idle": reading.agents_idle}
    yield _gauge(
        "semantic_agents", "Known agents, active within agent_idle_s or not.", agents, "state"
    )


def _gauge(name: str, doc: str, value: float | dict[str, Any], label: str = "") -> Metric:
    """A gauge of one value, or of one value per `label` value."""
    labels = [label] if isinstance(value, dict) else None
    return _filled(GaugeMetricFamily(name, doc, labels=labels), value)


def _counter(name: str, doc: str, value: float | dict[str, Any], label: str = "") -> Metric:
    """A counter of one total, or of one total per `label` value."""
    labels = [label] if isinstance(value, dict) else None
    return _filled(CounterMetricFamily(name, doc, labels=labels), value)


def _filled(
    family: GaugeMetricFamily | CounterMetricFamily, value: float | dict[str, Any]
) -> Metric:
    """`value` as the family's one sample, or as one sample per label value."""
    samples = value.items() if isinstance(value, dict) else [(None, value)]
    for label_value, number in samples:
        family.add_metric([] if label_value is None else [label_value], number)
    return family


# -- one app's catalog -----------------------------------------------------------------------


class _Collected(Collector):
    """A collector from a function (the registry calls `collect` at each scrape)."""

    def __init__(self, metrics: Callable[[], Iterable[Metric]]) -> None:
        self.metrics = metrics

    def collect(self) -> Iterable[Metric]:
        return self.metrics()


class Metrics:
    """Every metric of one app, in a registry of its own (tests build many apps): the HTTP
    layer's, the engine's (`EngineMetrics`, of whichever engine the app serves at the time),
    the process's (Linux: `process_resident_memory_bytes` …), and at each scrape the engine's
    state (`exposition`)."""

    def __init__(self, engine_metrics: Callable[[], EngineMetrics]) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "semantic_requests",
            "HTTP requests answered, by route (its template) and status.",
            ["route", "status"],
            registry=self.registry,
        )
        self.request_duration = Histogram(
            "semantic_request_duration_seconds",
            "HTTP requests from arrival to the last byte sent (streams included), by route.",
            ["route"],
            buckets=SECONDS,
            registry=self.registry,
        )
        self.registry.register(
            _Collected(lambda: (m for c in engine_metrics().collectors() for m in c.collect()))
        )
        ProcessCollector(registry=self.registry)

    def request_done(self, route: str, status: int, seconds: float) -> None:
        self.requests.labels(route, str(status)).inc()
        self.request_duration.labels(route).observe(seconds)

    def exposition(self, reading: EngineReading | ReplicasReading | None) -> bytes:
        """Every metric in Prometheus' text format; the engine's state from `reading` (None
        while the engine thread is not running)."""
        scrape = CollectorRegistry()
        scrape.register(_Collected(self.registry.collect))
        if reading is not None:
            scrape.register(_Collected(reading.families))
        return generate_latest(scrape)
