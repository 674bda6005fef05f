"""An exception anywhere in the engine loop, not only in the runner, fails the
requests in flight and nothing else; the engine thread lives on, serves the next request, and
every block is accounted for. Failures are injected into the real engine thread, once each."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from semantic.core import AgentKey, FinishReason, Request, SamplingParams, TokenEvent
from semantic.engine.engine import ENGINE_FAILED, Engine
from semantic.errors import EngineFailure, Unavailable
from semantic.models.served import ServedModel
from semantic.text.tokenizer import Tokenizer
from tests.unit.fakes import SteppedRunner, engine_on, fake_served, make_engine

LONG_CONTEXT = 1 << 16  # a request with `ignore_eos` runs until it is failed, never to its end
BLOCKS = LONG_CONTEXT // 8 + 64  # room for that in the pool, too


@pytest.fixture
def long_served(tiny_tokenizer: Tokenizer) -> ServedModel:
    return fake_served(tiny_tokenizer, context=LONG_CONTEXT)


def endless(i: int, agent: str | None = None) -> Request:
    prompt = [3 + (i * 13 + k) % 390 for k in range(12)]
    sampling = SamplingParams(temperature=0.0, max_tokens=LONG_CONTEXT, ignore_eos=True)
    return Request(f"r{i}", prompt, sampling, agent_id=agent)


def short(i: int) -> Request:
    prompt = [3 + (i * 13 + k) % 390 for k in range(12)]
    return Request(f"r{i}", prompt, SamplingParams(temperature=0.0, max_tokens=5))


async def last(events: AsyncIterator[TokenEvent]) -> TokenEvent:
    async for event in events:
        if event.final:
            return event
    raise AssertionError("the stream ended without a final event")


def fail_once(target: object, name: str) -> Callable[[], None]:
    """Arms `target.name` (a method) to raise the next time the engine calls it, once."""

    def arm() -> None:
        def broken(*args: Any, **kwargs: Any) -> Any:
            delattr(target, name)  # the class's method again, from the next call on
            raise RuntimeError(f"injected failure in {name}")

        setattr(target, name, broken)

    return arm


def failed_with(event: TokenEvent, cause: str) -> bool:
    """Whether the request failed as a fault: its client told only that the engine failed,
    the cause (`cause` in its text) kept for the log."""
    error = event.error
    return (
        isinstance(error, EngineFailure)
        and str(error) == ENGINE_FAILED
        and cause in repr(error.__cause__)
    )


def run_scenario(engine: Engine, arm: Callable[[], None]) -> tuple[list[TokenEvent], TokenEvent]:
    """Two requests running (one of an agent), a failure armed, then a third request. Returns
    the final events of the two, and of the third; checks the pool after each part."""

    async def scenario() -> tuple[list[TokenEvent], TokenEvent]:
        running = [engine.stream(endless(0, agent="alice")), engine.stream(endless(1))]
        for stream in running:
            await anext(stream)  # both have started decoding
        arm()
        ends = [await last(stream) for stream in running]
        await engine.call(engine.pool.check_integrity)
        after = await last(engine.stream(short(2)))
        await engine.call(engine.pool.check_integrity)
        assert await engine.call(lambda: engine.pool.num_held) == 0
        return ends, after

    engine.start()
    try:
        return asyncio.run(scenario())
    finally:
        engine.stop()


@pytest.mark.parametrize(
    ("owner", "method"),
    [
        ("scheduler", "schedule"),  # building the step's batch
        ("scheduler", "update"),  # postprocess: tokens computed, blocks hashed, tokens appended
        ("agents", "sweep"),  # the agents' housekeeping between steps
        ("runner", "run"),  # the model itself
    ],
)
def test_an_exception_in_the_engine_loop_fails_the_requests_in_flight_and_the_next_one_runs(
    long_served: ServedModel, tmp_path: Path, owner: str, method: str
) -> None:
    engine, _ = make_engine(long_served, tmp_path, num_blocks=BLOCKS)
    target = engine if owner == "engine" else getattr(engine, owner)
    ends, after = run_scenario(engine, fail_once(target, method))
    for end in ends:
        assert end.finish_reason is FinishReason.ERROR
        assert failed_with(end, "injected failure")
    assert after.error is None and after.finish_reason is FinishReason.LENGTH


@pytest.mark.parametrize("failure", ["publishing", "sampling"])
def test_one_requests_failure_in_a_step_fails_that_request_only(
    long_served: ServedModel, tmp_path: Path, failure: str
) -> None:
    """A request whose row cannot be sampled (non-finite probabilities, a value the draw
    refuses), or whose token cannot be published (decoding, a stop check, its sink), ends with
    an error; the other request in the same steps keeps getting its tokens."""
    engine, runner = make_engine(long_served, tmp_path, num_blocks=BLOCKS)
    marked = endless(1)
    marked.prompt_token_ids.insert(0, 2)  # the fake runner never generates ids below 3

    def arm() -> None:
        if failure == "publishing":
            fail_once(engine, "_on_token")()
        else:
            runner.fail_row_on_token = 2  # in r1's context only

    async def scenario() -> tuple[TokenEvent, TokenEvent, list[TokenEvent]]:
        streams = {"r0": engine.stream(endless(0, agent="alice")), "r1": engine.stream(marked)}
        for stream in streams.values():
            await anext(stream)  # both decode in every step from here on
        await engine.call(arm)
        failed = None
        while failed is None:
            for stream in streams.values():
                event = await anext(stream)
                if event.final:
                    failed = event
                    break
        survivor = streams["r1" if failed.request_id == "r0" else "r0"]
        after = [await anext(survivor) for _ in range(5)]
        engine.abort("r0" if failed.request_id == "r1" else "r1")
        aborted = await last(survivor)
        await engine.call(engine.pool.check_integrity)
        assert await engine.call(lambda: engine.pool.num_held) == 0
        return failed, aborted, after

    engine.start()
    try:
        failed, aborted, after = asyncio.run(scenario())
    finally:
        engine.stop()
    assert failed_with(failed, "injected")
    assert failed.finish_reason is FinishReason.ERROR
    if failure == "sampling":
        assert failed.request_id == "r1"
    assert all(event.token_ids and not event.final for event in after)
    assert aborted.error is None and aborted.finish_reason is FinishReason.ABORT


def test_a_failure_while_admitting_fails_that_request_only_and_leaks_no_block(
    long_served: ServedModel, tmp_path: Path
) -> None:
    """A request whose cache cannot be restored from disk (the runner refuses the copy) gets an
    error, while the requests already running go on untouched."""
    engine, runner = make_engine(long_served, tmp_path, num_blocks=BLOCKS)
    history = [3 + k % 390 for k in range(40)]  # five full blocks, then evicted to disk
    seed = Request("seed", history, SamplingParams(max_tokens=1), agent_id="bob")
    engine.submit(seed, lambda event: None)
    engine.run_until_idle()
    assert engine.agents.persist([AgentKey("bob")], timeout=10).failed == 0
    engine.stop()
    engine, runner = make_engine(long_served, tmp_path, num_blocks=BLOCKS)
    returning = Request("back", [*history, 7], SamplingParams(max_tokens=3), agent_id="bob")

    async def scenario() -> tuple[TokenEvent, TokenEvent, TokenEvent]:
        running = engine.stream(endless(0, agent="alice"))
        await anext(running)
        fail_once(runner, "write_block")()
        refused = await last(engine.stream(returning))
        await engine.call(engine.pool.check_integrity)
        again = await last(engine.stream(returning))  # the store reads the blocks again
        await engine.call(lambda: engine.abort("r0"))
        return refused, await last(running), again

    engine.start()
    try:
        refused, running_end, again = asyncio.run(scenario())
    finally:
        engine.stop()
    assert failed_with(refused, "write_block")
    assert running_end.error is None and running_end.finish_reason is FinishReason.ABORT
    assert again.error is None and again.usage is not None and again.usage.cached_tokens == 40
    assert engine.pool.num_held == 0
    engine.pool.check_integrity()


def test_a_failure_while_failing_requests_still_ends_every_stream(
    long_served: ServedModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The last line of defence: when ending the requests after a failure fails too (the
    bookkeeping itself is broken), each still gets its error event and the thread lives on."""
    engine, _ = make_engine(long_served, tmp_path, num_blocks=BLOCKS)
    arm_finished = fail_once(engine.agents, "finished")

    def arm() -> None:
        fail_once(engine.scheduler, "update")()
        arm_finished()

    ends, after = run_scenario(engine, arm)
    assert all(isinstance(end.error, EngineFailure) for end in ends)
    assert after.error is None


def test_a_client_whose_event_loop_is_gone_does_not_take_the_engine_down(
    long_served: ServedModel, tmp_path: Path
) -> None:
    """The rest of an answer goes to a loop that has closed: the engine drops it, finishes
    the request and serves the next one."""
    runner = SteppedRunner(num_blocks=64, block_tokens=8, vocab_size=400, first_token_id=3)
    engine = engine_on(runner, long_served, tmp_path)
    engine.start()
    try:
        gone = asyncio.new_event_loop()
        stream = engine.stream(short(0))
        runner.allow(1)
        assert gone.run_until_complete(anext(stream)).token_ids  # the first token
        gone.close()
        runner.release()  # four more tokens and the end, for no one
        after = asyncio.run(asyncio.wait_for(last(engine.stream(short(1))), timeout=30))
    finally:
        engine.stop()
    assert after.error is None and after.finish_reason is FinishReason.LENGTH
    assert engine.pool.num_held == 0


def test_calls_and_requests_left_to_a_stopped_engine_are_answered_never_left_waiting(
    long_served: ServedModel, tmp_path: Path
) -> None:
    engine, _ = make_engine(long_served, tmp_path)  # no thread: nothing takes the inbox

    async def scenario() -> None:
        queued_call = asyncio.ensure_future(engine.call(lambda: "never run"))
        queued_stream = asyncio.ensure_future(last(engine.stream(short(0))))
        await asyncio.sleep(0.05)  # both are in the inbox now (the stream after its prefetch)
        engine.stop()  # the engine ends with them still queued
        with pytest.raises(Unavailable):
            await asyncio.wait_for(queued_call, 5)
        refused = await asyncio.wait_for(queued_stream, 5)
        assert isinstance(refused.error, Unavailable)
        with pytest.raises(Unavailable):
            await asyncio.wait_for(engine.call(lambda: "too late"), 5)
        late = await asyncio.wait_for(last(engine.stream(short(1))), 5)
        assert isinstance(late.error, Unavailable)

    asyncio.run(scenario())
