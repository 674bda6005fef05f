"""The model swap's state machine (`EngineHost`) over fake runners: drain, cancel after
`swap_timeout_s`, requests that arrive during a swap, failed loads, caches kept per model."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from semantic.core import FinishReason, Request, SamplingParams, TokenEvent
from semantic.engine.engine import Engine
from semantic.engine.host import EngineHost
from semantic.engine.port import EnginePort
from semantic.errors import (
    InvalidRequest,
    ModelLoadFailed,
    ModelNotFound,
    Overloaded,
    Unavailable,
)
from semantic.models.registry import ModelRegistry
from semantic.settings.settings import Settings
from tests.unit.fake_models import FakeLoader, make_host

T = TypeVar("T")


def serve(host: EngineHost, scenario: Callable[[], Awaitable[T]]) -> T:
    """Run `scenario` on a loop with the host started, and stop it after."""

    async def run() -> T:
        host.start()
        try:
            return await scenario()
        finally:
            host.stop()

    return asyncio.run(run())


def request(i: int, prompt_len: int = 10, **sampling: Any) -> Request:
    prompt = [3 + (i * 13 + k) % 390 for k in range(prompt_len)]
    params = SamplingParams(**{"temperature": 0.0, "max_tokens": 6, **sampling})
    return Request(f"r{i}", prompt, params)


async def generate(engine: EnginePort, req: Request) -> list[TokenEvent]:
    return [event async for event in engine.stream(req)]


async def until(condition: Callable[[], bool]) -> None:
    """Yield to the loop until `condition` holds (no clock involved)."""
    while not condition():
        await asyncio.sleep(0)


# -- draining --------------------------------------------------------------------------------


def test_a_swap_lets_running_requests_finish_then_serves_the_new_model(
    loader: FakeLoader, models: dict[str, Path], tmp_path: Path
) -> None:
    host = make_host(loader, models, tmp_path)

    async def scenario() -> tuple[Any, ...]:
        old = await host.acquire()
        swap = asyncio.ensure_future(host.swap("model-b"))
        await until(lambda: host.swapping)
        # The lease holds model a: it still serves, and the swap waits for it.
        events = await generate(old, request(0))
        waited = not swap.done()
        host.release()
        report = await swap
        new = await host.acquire()
        host.release()
        return events, waited, report, old, new

    events, waited, report, old, new = serve(host, scenario)
    assert events[-1].finish_reason is FinishReason.LENGTH
    assert waited
    assert (report.previous, report.model, report.swapped, report.cancelled) == ("a", "b", True, 0)
    assert report.seconds >= report.load_seconds > 0
    assert not old.alive and new.model.name == "b"
    [swaps] = [
        s
        for m in host.metrics.model_swap_duration.collect()
        for s in m.samples
        if s.name.endswith("_count")
    ]
    assert swaps.value == 1


def test_requests_still_running_at_the_swap_timeout_are_cancelled_as_overloaded(
    loader: FakeLoader, models: dict[str, Path], tmp_path: Path
) -> None:
    loader.go = threading.Event()  # model a's steps wait until the test lets them
    host = make_host(loader, models, tmp_path, swap_timeout_s=0)
    old = host.engine
    assert isinstance(old, Engine)
    cancelling = asyncio.Event()
    cancel_all = old.cancel_all

    async def spied_cancel_all(error: Exception) -> int:
        cancelling.set()  # `cancel_all` queues its message before the swap task yields
        return await cancel_all(error)

    old.cancel_all = spied_cancel_all  # type: ignore[method-assign]

    async def scenario() -> tuple[Any, ...]:
        engine = await host.acquire()
        running = asyncio.ensure_future(generate(engine, request(0, max_tokens=50)))
        swap = asyncio.ensure_future(host.swap("model-b"))
        await cancelling.wait()
        loader.go.set()  # type: ignore[union-attr]
        events = await running
        host.release()
        return events, await swap

    events, report = serve(host, scenario)
    final = events[-1]
    assert final.finish_reason is FinishReason.ABORT and isinstance(final.error, Overloaded)
    assert "swap_timeout_s=0" in str(final.error)
    assert report.cancelled == 1 and report.model == "b"
    late: list[TokenEvent] = []
    old.submit(request(1), late.append)  # the cancelled engine refuses, it does not hang
    assert isinstance(late[0].error, Overloaded)


# -- requests that arrive during a swap ------------------------------------------------------


def test_a_request_arriving_during_a_swap_waits_and_gets_the_new_model(
    loader: FakeLoader, models: dict[str, Path], tmp_path: Path
) -> None:
    host = make_host(loader, models, tmp_path)

    async def scenario() -> tuple[Any, ...]:
        loader.hold.clear()  # the swap stops in its load
        swap = asyncio.ensure_future(host.swap("model-b"))
        await until(lambda: loader.loads == ["a", "b"])
        arriving = asyncio.ensure_future(host.acquire())
        await asyncio.sleep(0)
        waited = not arriving.done()
        loader.hold.set()
        engine = await arriving
        events = await generate(engine, request(0))
        host.release()
        await swap
        return waited, engine, events

    waited, engine, events = serve(host, scenario)
    assert waited and engine.model.name == "b"
    assert events[-1].finish_reason is FinishReason.LENGTH


def test_a_request_that_would_wait_past_swap_wait_s_is_refused_as_overloaded(
    loader: FakeLoader, models: dict[str, Path], tmp_path: Path
) -> None:
    host = make_host(loader, models, tmp_path, swap_wait_s=0)

    async def scenario() -> tuple[Any, ...]:
        loader.hold.clear()
        swap = asyncio.ensure_future(host.swap("model-b"))
        await until(lambda: loader.loads == ["a", "b"])
        with pytest.raises(Overloaded, match="swap_wait_s=0"):
            await host.acquire()
        with pytest.raises(Overloaded):
            host.engine  # noqa: B018  (nothing is loaded mid-swap)
        state = host.state
        loader.hold.set()
        await swap
        return state, host.state

    assert serve(host, scenario) == ("swapping", "serving")


def test_a_swap_whose_caller_goes_away_still_finishes(
    loader: FakeLoader, models: dict[str, Path], tmp_path: Path
) -> None:
    host = make_host(loader, models, tmp_path)

    async def scenario() -> str:
        loader.hold.clear()
        caller = asyncio.ensure_future(host.swap("model-b"))
        await until(lambda: loader.loads == ["a", "b"])
        caller.cancel()  # the admin's HTTP client hung up mid-swap
        loader.hold.set()
        engine = await host.acquire()
        host.release()
        return engine.model.name

    assert serve(host, scenario) == "b"


# -- failures --------------------------------------------------------------------------------


def test_a_model_that_fails_to_load_leaves_the_previous_model_serving(
    loader: FakeLoader, models: dict[str, Path], tmp_path: Path
) -> None:
    loader.broken.add("broken")
    host = make_host(loader, models, tmp_path)

    async def scenario() -> tuple[Any, ...]:
        with pytest.raises(ModelLoadFailed, match=r"truncated.*'a' is serving again"):
            await host.swap(str(models["broken"]))
        engine = await host.acquire()
        events = await generate(engine, request(0))
        host.release()
        return engine, events

    engine, events = serve(host, scenario)
    assert engine.model.name == "a" and host.state == "serving"
    assert loader.loads == ["a", "broken", "a"]
    assert events[-1].finish_reason is FinishReason.LENGTH


def test_an_unknown_model_is_refused_before_anything_stops(
    loader: FakeLoader, models: dict[str, Path], tmp_path: Path
) -> None:
    host = make_host(loader, models, tmp_path)
    engine = host.engine

    async def scenario() -> None:
        with pytest.raises(ModelNotFound, match="unknown model 'no-such-model'"):
            await host.swap("no-such-model")
        with pytest.raises(ModelLoadFailed, match="neither a GGUF file"):
            await host.swap(str(tmp_path))  # a folder, but no model in it

    serve(host, scenario)
    assert host.engine is engine and loader.loads == ["a"]


def test_when_neither_model_loads_requests_are_refused_until_a_swap_succeeds(
    loader: FakeLoader, models: dict[str, Path], tmp_path: Path
) -> None:
    host = make_host(loader, models, tmp_path)

    async def scenario() -> str:
        loader.broken |= {"broken", "a"}
        with pytest.raises(ModelLoadFailed, match=r"nor 'a' again.*no model is loaded"):
            await host.swap(str(models["broken"]))
        state = host.state
        with pytest.raises(Unavailable, match="no model is loaded"):
            await host.acquire()
        await host.swap("model-b")
        engine = await host.acquire()
        host.release()
        return f"{state} → {host.state} with {engine.model.name}"

    assert serve(host, scenario) == "failed → serving with b"


def test_swapping_to_the_loaded_model_changes_nothing(
    loader: FakeLoader, models: dict[str, Path], tmp_path: Path
) -> None:
    host = make_host(loader, models, tmp_path)
    engine = host.engine
    report = serve(host, lambda: host.swap(str(models["a"])))
    assert not report.swapped and report.model == "a"
    assert host.engine is engine and loader.loads == ["a"]


def test_an_engine_without_a_loader_cannot_swap(
    loader: FakeLoader, models: dict[str, Path], tmp_path: Path
) -> None:
    engine = loader(ModelRegistry().resolve(str(models["a"])))
    host = EngineHost(engine, Settings(cache_dir=tmp_path / "cache"))
    with pytest.raises(InvalidRequest, match="cannot swap"):
        serve(host, lambda: host.swap(str(models["b"])))


# -- swap on request -------------------------------------------------------------------------


def test_with_swap_on_request_a_request_naming_an_alias_swaps_but_never_a_path(
    loader: FakeLoader, models: dict[str, Path], tmp_path: Path
) -> None:
    host = make_host(loader, models, tmp_path, swap_on_request=True)

    async def scenario() -> list[str]:
        served = []
        for name in (str(models["b"]), "gpt-4o", "MODEL-B", "model-b", "a"):
            engine = await host.acquire(name)
            served.append(engine.model.name)
            host.release()
        return served

    # A path and an unknown name get the loaded model; the alias (any case) swaps, once; "a"
    # is no alias (only a folder name), so it is served by b.
    assert serve(host, scenario) == ["a", "a", "b", "b", "b"]
    assert loader.loads == ["a", "b"]


def test_without_swap_on_request_a_request_naming_an_alias_gets_the_loaded_model(
    loader: FakeLoader, models: dict[str, Path], tmp_path: Path
) -> None:
    host = make_host(loader, models, tmp_path)

    async def scenario() -> str:
        engine = await host.acquire("model-b")
        host.release()
        return engine.model.name

    assert serve(host, scenario) == "a" and loader.loads == ["a"]


# -- caches ----------------------------------------------------------------------------------


def test_each_models_cache_is_persisted_by_the_swap_and_reused_when_it_returns(
    loader: FakeLoader, models: dict[str, Path], tmp_path: Path
) -> None:
    host = make_host(loader, models, tmp_path)
    prompt = request(0, prompt_len=30)

    async def scenario() -> list[int]:
        cached = []
        for model in (str(models["a"]), "model-b", str(models["a"])):
            await host.swap(model)
            engine = await host.acquire()
            for _ in range(2):
                final = (await generate(engine, prompt))[-1]
                assert final.usage is not None
                cached.append(final.usage.cached_tokens)
            host.release()
        return cached

    cached = serve(host, scenario)
    # a: cold, then from memory; b: cold (never a's cache), then from memory; a again: from
    # the disk the first swap persisted to, then from memory.
    assert cached[0] == 0 and cached[1] > 0
    assert cached[2] == 0 and cached[3] > 0
    assert cached[4] > 0
    assert len(list((tmp_path / "cache" / "kv").iterdir())) == 2  # one folder per model
