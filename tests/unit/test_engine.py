"""The engine over the fake runner: events, stops, failures, aborts, the thread bridge."""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path

import pytest

from semantic.core import FinishReason, Request, SamplingParams, TokenEvent
from semantic.engine.engine import Engine
from semantic.errors import (
    ContextOverflow,
    EngineFailure,
    InvalidRequest,
    Overloaded,
    PoolExhausted,
)
from semantic.models.served import ServedModel
from tests.unit.fakes import CONTEXT, make_engine, scheduler_clock


def request(i: int, prompt_len: int = 10, **sampling: object) -> Request:
    prompt = [3 + (i * 13 + k) % 390 for k in range(prompt_len)]
    params = SamplingParams(**{"temperature": 0.0, "max_tokens": 6, **sampling})  # type: ignore[arg-type]
    return Request(f"r{i}", prompt, params)


def collect(engine: Engine, requests: list[Request]) -> dict[str, list[TokenEvent]]:
    events: dict[str, list[TokenEvent]] = {r.request_id: [] for r in requests}
    for r in requests:
        engine.submit(r, events[r.request_id].append)
    engine.run_until_idle()
    return events


def test_a_request_streams_its_tokens_then_a_final_event_with_usage(
    served: ServedModel, tmp_path: Path
) -> None:
    engine, _ = make_engine(served, tmp_path)
    [events] = collect(engine, [request(0, max_tokens=5)]).values()
    assert sum(len(e.token_ids) for e in events) == 5
    final = events[-1]
    assert final.finish_reason is FinishReason.LENGTH and final.usage is not None
    assert (final.usage.prompt_tokens, final.usage.completion_tokens) == (10, 5)
    assert all(not e.final for e in events[:-1])
    token_ids = [t for e in events for t in e.token_ids]
    assert "".join(e.text for e in events) == served.tokenizer.decode(token_ids)


def test_a_stop_token_ends_the_request_without_its_text(
    served: ServedModel, tmp_path: Path
) -> None:
    engine, _ = make_engine(served, tmp_path)
    free = [t for e in collect(engine, [request(0, max_tokens=6)])["r0"] for t in e.token_ids]
    engine, _ = make_engine(served, tmp_path)
    stopped = collect(engine, [request(0, max_tokens=6, stop_token_ids=(free[2],))])["r0"]
    assert [t for e in stopped for t in e.token_ids] == free[:3]
    assert stopped[-1].finish_reason is FinishReason.STOP and stopped[-1].text == ""


def test_min_tokens_keeps_end_tokens_from_being_sampled(
    served: ServedModel, tmp_path: Path
) -> None:
    engine, runner = make_engine(served, tmp_path)
    eos = next(iter(served.tokenizer.eos_token_ids))
    events = collect(engine, [request(0, max_tokens=4, min_tokens=3)])["r0"]
    sampled = [i for b in runner.steps for i in b.items if i.sample]
    assert [eos in i.suppress_token_ids for i in sampled] == [True, True, True, False]
    assert events[-1].usage is not None and events[-1].usage.completion_tokens == 4


def test_many_requests_with_aborts_leave_no_block_behind(
    served: ServedModel, tmp_path: Path
) -> None:
    engine, _ = make_engine(served, tmp_path)
    rng = random.Random(7)
    for round_ in range(20):
        batch = [
            request(round_ * 10 + i, rng.randint(1, 60), max_tokens=rng.randint(1, 20))
            for i in range(rng.randint(1, 8))
        ]
        for r in batch:
            engine.submit(r, lambda event: None)
        for _ in range(rng.randint(0, 6)):
            engine.step()
        for r in rng.sample(batch, k=len(batch) // 2):
            engine.abort(r.request_id)
        engine.run_until_idle()
        engine.pool.check_integrity()
        assert engine.pool.num_held == 0 and not engine.scheduler.has_work


def test_a_runner_failure_fails_only_the_requests_in_that_step(
    served: ServedModel, tmp_path: Path
) -> None:
    engine, _ = make_engine(served, tmp_path, fail_on_token=3 + 5)
    poisoned = Request("bad", [3 + 5] * 4, SamplingParams(max_tokens=3))
    events = collect(engine, [poisoned])
    assert isinstance(events["bad"][-1].error, EngineFailure)
    assert events["bad"][-1].finish_reason is FinishReason.ERROR
    healthy = collect(engine, [request(1)])
    assert healthy["r1"][-1].finish_reason is FinishReason.LENGTH
    assert engine.pool.num_held == 0


def test_a_request_that_waits_past_the_queue_timeout_is_overloaded(
    served: ServedModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = scheduler_clock(monkeypatch)
    engine, _ = make_engine(served, tmp_path, num_blocks=4, queue_timeout_s=0.05)
    hog = request(0, prompt_len=24, max_tokens=10_000, ignore_eos=True)  # holds every block
    waiter = request(1, prompt_len=20)
    waiter.arrival_time = clock.now
    events: dict[str, list[TokenEvent]] = {"r0": [], "r1": []}
    engine.submit(hog, events["r0"].append)
    engine.step()
    engine.submit(waiter, events["r1"].append)
    engine.step()
    clock.now += 0.04
    engine.step()
    assert events["r1"] == []  # still waiting, within its time
    clock.now += 0.02
    engine.step()
    assert isinstance(events["r1"][-1].error, Overloaded)
    engine.abort("r0")
    engine.run_until_idle()
    assert engine.pool.num_held == 0


def test_a_request_whose_wait_ran_out_but_that_fits_now_runs(
    served: ServedModel, tmp_path: Path
) -> None:
    """The timeout refuses only what is still waiting once admission has had its turn: a
    request that arrives with its wait already past the timeout (a reply's later request
    used to carry its first one's arrival) and finds room runs."""
    engine, _ = make_engine(served, tmp_path, queue_timeout_s=1.0)
    late = request(0)
    late.arrival_time -= 10
    events = collect(engine, [late])
    assert events["r0"][-1].error is None
    assert events["r0"][-1].finish_reason is FinishReason.LENGTH


def test_a_preempted_request_not_resumed_in_time_says_it_was_preempted(
    served: ServedModel, tmp_path: Path
) -> None:
    """Two answers outgrow the pool together: a decode that finds it dry takes the newer out,
    and the older holds the pool past the timeout (on the scheduler's clock): the newer is
    refused as preempted, not as never let in."""
    engine, _ = make_engine(served, tmp_path, num_blocks=8, queue_timeout_s=1.0)
    now = [0.0]
    engine.scheduler.clock = lambda: now[0]
    older, newer = (request(i, prompt_len=16, max_tokens=10_000, ignore_eos=True) for i in (0, 1))
    events: dict[str, list[TokenEvent]] = {"r0": [], "r1": []}
    for r in (older, newer):
        r.arrival_time = 0.0
        engine.submit(r, events[r.request_id].append)
    while not engine.scheduler.preemptions:
        engine.step()
    assert [seq.request.request_id for seq in engine.scheduler.waiting] == ["r1"]
    now[0] = 1.5
    engine.step()
    error = events["r1"][-1].error
    assert isinstance(error, Overloaded) and "preempted" in str(error)
    engine.run_until_idle()
    assert events["r0"][-1].error is None
    assert engine.pool.num_held == 0


def test_requests_that_can_never_run_are_refused_up_front(
    served: ServedModel, tmp_path: Path
) -> None:
    engine, _ = make_engine(served, tmp_path)
    with pytest.raises(InvalidRequest):
        engine.check(Request("empty", [], SamplingParams()))
    vocab = served.config.vocab_size
    for outside in (vocab, -1):
        with pytest.raises(InvalidRequest, match=f"token id {outside}, outside"):
            engine.check(Request("outside", [1, outside, 2], SamplingParams()))
    with pytest.raises(PoolExhausted):
        engine.check(request(0, prompt_len=32 * 8))  # more than the pool holds
    big_pool, _ = make_engine(served, tmp_path / "big", num_blocks=1000)
    with pytest.raises(ContextOverflow):
        big_pool.check(request(0, prompt_len=CONTEXT))


def test_the_thread_streams_events_and_closing_the_stream_aborts(
    served: ServedModel, tmp_path: Path
) -> None:
    engine, _ = make_engine(served, tmp_path)

    async def scenario() -> tuple[list[TokenEvent], int]:
        complete = [e async for e in engine.stream(request(0, max_tokens=5))]
        endless = engine.stream(request(1, max_tokens=10_000, ignore_eos=True))
        async for _ in endless:
            break
        await endless.aclose()  # type: ignore[attr-defined]
        deadline = time.monotonic() + 60  # a hang guard: a loaded machine aborts later
        while engine.stats().running and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        return complete, engine.stats().blocks_held

    engine.start()
    try:
        complete, held = asyncio.run(scenario())
    finally:
        engine.stop()
    assert complete[-1].finish_reason is FinishReason.LENGTH
    assert held == 0
