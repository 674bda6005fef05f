"""The engine being served, and the one way to change it: a model swap.

An engine serves one model for its whole life (ours: its pool, prefix hashes, disk tier and
scheduler are all cut for that model), so a swap does not change an engine: it stops the old one
(which persists its caches), reclaims its memory, and starts a new one. Every HTTP request holds
a lease on the engine it started with (`api/gate.py`), so no request ever sees two models.
docs/design.md says why the swap lives here rather than in the engine thread.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, NoReturn

from semantic import memory
from semantic.engine.port import EnginePort
from semantic.errors import InvalidRequest, ModelLoadFailed, Overloaded, Unavailable
from semantic.models.registry import ModelRegistry, ModelSource
from semantic.observability import EngineMetrics
from semantic.settings.settings import Settings

log = logging.getLogger(__name__)

# After cancelling, how long a swap waits for the cancelled requests' responses to end before it
# unloads anyway (a client that stopped reading can hold its response open for ever).
CANCEL_GRACE_S = 10.0

Loader = Callable[[ModelSource], EnginePort]


@dataclass(slots=True, frozen=True)
class SwapReport:
    """What a swap did and how long each part took, in seconds."""

    model: str  # serving now
    previous: str
    swapped: bool  # False when the model asked for was already loaded
    seconds: float
    drain_seconds: float = 0.0  # running requests finishing, or cancelled
    unload_seconds: float = 0.0  # the old engine stopped, its caches persisted, memory freed
    load_seconds: float = 0.0
    cancelled: int = 0  # requests still running at `swap_timeout_s`


class EngineHost:
    """Owns the engine's lifetime: which model is loaded, who is using it, and swaps.

    Serving: the gate is open, and `engine` is the engine of `source`. Swapping: the gate is
    closed; requests that arrive wait for it (`swap_wait_s`, then Overloaded). A lease holds the
    engine it was given until it is released, and an engine is stopped only once no lease holds
    it, or after its requests were cancelled. If neither the new model nor the old one loads, no
    model is loaded, and requests are refused at once until a swap succeeds.

    Only the event loop's thread calls in (nothing here locks); loads run on their own thread.
    """

    def __init__(
        self,
        engine: EnginePort,
        settings: Settings,
        *,
        source: ModelSource | None = None,
        registry: ModelRegistry | None = None,
        load: Loader | None = None,
    ) -> None:
        self.settings = settings
        self.registry = registry or ModelRegistry(settings.model_aliases)
        self.metrics: EngineMetrics = engine.metrics  # outlives every engine it is lent to
        self.last_swap: SwapReport | None = None
        self._engine: EnginePort | None = engine
        self._source = source
        self._load = load
        self._failure: str | None = None  # why no model is loaded, when none is
        self._leases = 0
        self._swaps: set[asyncio.Future[SwapReport]] = set()
        self._open, self._idle, self._swap_lock = _open_gate()

    # -- serving ---------------------------------------------------------------------------

    def start(self) -> None:
        """Start the engine (from the app's startup, on the event loop that serves it; once, as
        an engine starts once)."""
        self.engine.start()

    def stop(self) -> None:
        """Stop the engine, which persists its caches."""
        if self._engine is not None:
            self._engine.stop()

    @property
    def engine(self) -> EnginePort:
        """The engine loaded now: Overloaded while a swap has none loaded, Unavailable when no
        model could be loaded."""
        if self._failure is not None:
            raise Unavailable(self._failure)
        if self._engine is None:
            raise Overloaded("the server is swapping models; try again shortly")
        return self._engine

    @property
    def source(self) -> ModelSource | None:
        """Where the loaded model came from (None if unknown: an engine built by hand)."""
        return self._source

    @property
    def swapping(self) -> bool:
        return self._swap_lock.locked()

    @property
    def state(self) -> Literal["serving", "swapping", "failed"]:
        """`failed`: no model is loaded, since a swap could load neither model."""
        if self.swapping:
            return "swapping"
        return "failed" if self._engine is None else "serving"

    async def acquire(self, model: str | None = None) -> EnginePort:
        """A lease on the engine for one request; give it back with `release`. Waits while a
        swap runs, up to `swap_wait_s`. With `swap_on_request`, a `model` that is the alias of
        another model swaps to that model first."""
        wanted = self._wanted(model)
        deadline = time.monotonic() + self.settings.swap_wait_s
        while True:
            await self._wait_open(deadline)
            if wanted is None or self.is_loaded(wanted):
                break
            await self.swap_to(wanted)
        self._leases += 1
        self._idle.clear()
        return self.engine

    def release(self) -> None:
        self._leases -= 1
        if self._leases == 0:
            self._idle.set()

    # -- swapping --------------------------------------------------------------------------

    async def swap(self, name: str) -> SwapReport:
        """Serve the model `name` (an alias or a path) from now on. A name that resolves to no
        model is refused before anything stops; a model that fails to load leaves the previous
        one loaded again, and raises ModelLoadFailed saying so."""
        return await self.swap_to(self.registry.resolve(name))

    async def swap_to(self, source: ModelSource) -> SwapReport:
        """Serve `source` from now on. Once begun, a swap runs to its end even if its caller goes
        away: stopped halfway, it would leave no model loaded and the gate closed."""
        if self._engine is not None:
            self._engine.capabilities.require("swap", "swapping models")
        if self._load is None:
            raise InvalidRequest("this server was built without a model loader: it cannot swap")
        swap = asyncio.ensure_future(self._swap(source))
        self._swaps.add(swap)  # the loop holds tasks weakly
        swap.add_done_callback(self._swaps.discard)
        return await asyncio.shield(swap)

    async def _swap(self, source: ModelSource) -> SwapReport:
        async with self._swap_lock:
            previous = self._engine.model.name if self._engine is not None else "none"
            if self.is_loaded(source):
                return SwapReport(previous, previous, False, 0.0)
            started = time.monotonic()
            self._open.clear()
            try:
                report = await self._replace(source, previous, started)
            finally:
                if self._engine is not None:
                    self._open.set()
                self.metrics.model_swap_duration.observe(time.monotonic() - started)
        self.last_swap = report
        log.info(
            "swapped %s → %s in %.2f s (drain %.2f s, unload %.2f s, load %.2f s; %d cancelled)",
            report.previous,
            report.model,
            report.seconds,
            report.drain_seconds,
            report.unload_seconds,
            report.load_seconds,
            report.cancelled,
        )
        return report

    async def _replace(self, source: ModelSource, previous: str, started: float) -> SwapReport:
        """Drain, unload, load: the swap itself, behind the closed gate."""
        log.info("swapping %s → %s (%s)", previous, source.name, source.path)
        cancelled = await self._drain() if self._engine is not None else 0
        drained = time.monotonic()
        await self._unload()
        unloaded = time.monotonic()
        await self._load_or_restore(source)
        loaded = time.monotonic()
        return SwapReport(
            model=self.engine.model.name,
            previous=previous,
            swapped=True,
            seconds=loaded - started,
            drain_seconds=drained - started,
            unload_seconds=unloaded - drained,
            load_seconds=loaded - unloaded,
            cancelled=cancelled,
        )

    async def _drain(self) -> int:
        """Let the requests holding leases finish for `swap_timeout_s`, then cancel them (they
        get Overloaded, 503) and give them a moment to answer. Returns how many were cancelled."""
        timeout = self.settings.swap_timeout_s
        if await _within(timeout, self._idle.wait()):
            return 0
        error = Overloaded(
            f"cancelled by a model swap after swap_timeout_s={timeout:g} s; try again shortly"
        )
        engine, cancelled = self.engine, 0
        try:  # bounded: an engine thread that has died would never answer
            async with asyncio.timeout(CANCEL_GRACE_S):
                cancelled = await engine.cancel_all(error)
        except TimeoutError:
            log.error("the engine did not answer the swap's cancel; unloading it anyway")
        if not await _within(CANCEL_GRACE_S, self._idle.wait()):
            log.warning("%d responses still open after the swap cancelled them", self._leases)
        return cancelled

    async def _unload(self) -> None:
        """Stop the engine (it persists every hot cache), drop it and reclaim its memory."""
        engine, self._engine = self._engine, None
        if engine is not None:
            await asyncio.to_thread(engine.stop)
            del engine
        memory.reclaim()

    async def _load_or_restore(self, source: ModelSource) -> None:
        """Load `source`; failing that, load the previous model again and raise."""
        previous = self._source
        try:
            await self._install(source)
        except Exception as failure:
            log.error("loading %s failed: %s", source.name, failure)
            memory.reclaim()
            await self._restore(previous, source, failure)

    async def _restore(
        self, previous: ModelSource | None, failed: ModelSource, failure: Exception
    ) -> NoReturn:
        why = f"could not load model {failed.name!r}: {failure}"
        if previous is not None:
            try:
                await self._install(previous)
            except Exception as again:
                why += f"; nor {previous.name!r} again: {again}"
            else:
                raise ModelLoadFailed(f"{why}; {previous.name!r} is serving again") from failure
        self._failure = f"{why}; no model is loaded: swap to one that loads"
        raise ModelLoadFailed(self._failure) from failure

    async def _install(self, source: ModelSource) -> None:
        assert self._load is not None
        engine = await asyncio.to_thread(self._load, source)
        engine.metrics = self.metrics
        engine.start()
        self._engine, self._source, self._failure = engine, source, None

    # -- the gate --------------------------------------------------------------------------

    async def _wait_open(self, deadline: float) -> None:
        while not self._open.is_set():
            if self._failure is not None and not self.swapping:
                raise Unavailable(self._failure)
            if not await _within(deadline - time.monotonic(), self._open.wait()):
                raise Overloaded(
                    "the server is swapping models and did not finish within "
                    f"swap_wait_s={self.settings.swap_wait_s:g} s; try again shortly"
                )

    def _wanted(self, model: str | None) -> ModelSource | None:
        """The model a request's `model` field asks to swap to: only with `swap_on_request`,
        and only a registered alias (never a path a client sent)."""
        if model is None or not self.settings.swap_on_request or not self.registry.knows(model):
            return None
        return self.registry.resolve(model)

    def would_swap(self, model: str) -> bool:
        """Whether a request naming `model` would swap models now (`acquire`)."""
        wanted = self._wanted(model)
        return wanted is not None and not self.is_loaded(wanted)

    def is_loaded(self, source: ModelSource) -> bool:
        return self._source is not None and _same_path(self._source.path, source.path)


def _open_gate() -> tuple[asyncio.Event, asyncio.Event, asyncio.Lock]:
    """(open, idle, swap lock) for a host that is serving and not in use."""
    open_, idle = asyncio.Event(), asyncio.Event()
    open_.set()
    idle.set()
    return open_, idle, asyncio.Lock()


async def _within(seconds: float, waiting: Coroutine[Any, Any, Any]) -> bool:
    """Whether `waiting` finished within `seconds` (it is cancelled if not)."""
    try:
        async with asyncio.timeout(max(0.0, seconds)):
            await waiting
    except TimeoutError:
        return False
    return True


def _same_path(a: Path, b: Path) -> bool:
    return a.resolve() == b.resolve()
