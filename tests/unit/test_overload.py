"""Overload that stays fair, through the engine and the fake runner on a virtual clock (the
scheduler's `clock`, advanced by the test, never the machine's): a streaming answer keeps its
place when newcomers lack room, a decode that finds the pool dry takes out a prompt before an
answer, requests that fit pass one that lacks room for a while only, a preempted answer is
never passed, a one-off takes agents' cached pages once it has waited long enough, and under a
load that never stops over a tiny pool no request waits until its queue timeout."""

from __future__ import annotations

import itertools
from collections import defaultdict
from pathlib import Path

from semantic.cache.pages.block_manager import ONE_OFF_PATIENCE_S
from semantic.cache.pages.block_pool import TIER_WORKING_AGENT
from semantic.core import Request, SamplingParams, Sequence, TokenEvent
from semantic.engine.engine import Engine
from semantic.engine.scheduler import PASSED_FOR_S
from semantic.models.served import ServedModel
from tests.unit.fakes import make_engine

BLOCK = 8  # make_engine's block size


class Clock:
    """The scheduler's virtual seconds: the test moves them."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def on_clock(engine: Engine) -> Clock:
    clock = Clock()
    engine.scheduler.clock = clock
    return clock


def prompt_of(name: str, length: int) -> list[int]:
    seed = sum(map(ord, name))
    return [3 + (seed * 31 + k * 7) % 380 for k in range(length)]


def send(
    engine: Engine,
    clock: Clock,
    name: str,
    prompt: list[int],
    max_tokens: int,
    agent: str | None = None,
) -> list[TokenEvent]:
    """Submit a request arriving now on `clock`; returns the list its events land in."""
    events: list[TokenEvent] = []
    sampling = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    request = Request(name, prompt, sampling, agent, arrival_time=clock.now)
    engine.submit(request, events.append)
    return events


def tokens(events: list[TokenEvent]) -> list[int]:
    return [t for e in events for t in e.token_ids]


def done(events: list[TokenEvent]) -> bool:
    return bool(events) and events[-1].final


def waiting(engine: Engine) -> list[str]:
    return [seq.request.request_id for seq in engine.scheduler.waiting]


def seq_of(engine: Engine, name: str) -> Sequence:
    every = [*engine.scheduler.waiting, *engine.scheduler.running, *engine.scheduler.restoring]
    return next(seq for seq in every if seq.request.request_id == name)


def reads_at_once(engine: Engine) -> None:
    """Blocks read back from disk land before the next step (the disk reader's thread would
    make a restore take a number of steps that depends on the machine)."""
    read = engine.tiering._read
    engine.tiering.read = read  # type: ignore[method-assign]


def alone(served: ServedModel, tmp_path: Path, prompt: list[int], max_tokens: int) -> list[int]:
    engine, _ = make_engine(served, tmp_path / "alone", num_blocks=256)
    events = send(engine, on_clock(engine), "alone", prompt, max_tokens)
    engine.run_until_idle()
    return tokens(events)


def test_a_newcomer_that_lacks_room_waits_for_a_streaming_answer_instead_of_stopping_it(
    served: ServedModel, tmp_path: Path
) -> None:
    engine, _ = make_engine(served, tmp_path, num_blocks=16)
    clock = on_clock(engine)
    long_prompt, late_prompt = prompt_of("long", 90), prompt_of("late", 40)
    long = send(engine, clock, "long", long_prompt, max_tokens=30)  # 12 of 16 blocks, growing
    while len(tokens(long)) < 10:
        engine.step()
    late = send(engine, clock, "late", late_prompt, max_tokens=3)
    step_of: dict[str, list[int]] = defaultdict(list)
    step = 0
    while not (done(long) and done(late)):
        before = {name: len(tokens(e)) for name, e in (("long", long), ("late", late))}
        engine.step()
        step += 1
        for name, events in (("long", long), ("late", late)):
            step_of[name] += [step] * (len(tokens(events)) - before[name])
    assert engine.scheduler.preemptions == 0
    streamed = step_of["long"]
    assert streamed == list(range(1, len(streamed) + 1)), "the answer missed a step"
    assert step_of["late"][0] > streamed[-1], "the newcomer took the answer's room"
    assert tokens(long) == alone(served, tmp_path / "a", long_prompt, 30)
    assert tokens(late) == alone(served, tmp_path / "b", late_prompt, 3)


def test_a_decode_that_finds_the_pool_dry_takes_out_a_prompt_before_a_streaming_answer(
    served: ServedModel, tmp_path: Path
) -> None:
    # Steps of 16 tokens (8 of prompt beside a decode): a prompt admitted into every page but
    # the answer's headroom is still being prefilled when the answer needs a second new block.
    engine, _ = make_engine(served, tmp_path, num_blocks=16, max_batch_tokens=16)
    clock = on_clock(engine)
    answer_prompt = prompt_of("answer", 20)
    answer = send(engine, clock, "answer", answer_prompt, max_tokens=40)
    while len(tokens(answer)) < 2:
        engine.step()
    room = engine.pool.num_available() - 1  # keeping the answer's headroom
    prompt = prompt_of("prompt", room * BLOCK)
    late = send(engine, clock, "prompt", prompt, max_tokens=4)
    engine.step()
    assert seq_of(engine, "prompt") in engine.scheduler.running
    streamed = len(tokens(answer))
    while not engine.scheduler.preemptions:
        engine.step()
        assert len(tokens(answer)) == streamed + 1, "the answer missed a step"
        streamed += 1
    assert waiting(engine) == ["prompt"] and not tokens(late)
    engine.run_until_idle()
    assert tokens(answer) == alone(served, tmp_path / "a", answer_prompt, 40)
    assert tokens(late) == alone(served, tmp_path / "b", prompt, 4)


def test_requests_that_fit_pass_one_that_lacks_room_for_a_while_then_wait_behind_it(
    served: ServedModel, tmp_path: Path
) -> None:
    engine, _ = make_engine(served, tmp_path, num_blocks=16)
    clock = on_clock(engine)
    hog = send(engine, clock, "hog", prompt_of("hog", 64), max_tokens=40)  # 9 of 16 blocks
    engine.step()
    big = send(engine, clock, "big", prompt_of("big", 64), max_tokens=2)  # lacks room
    small = send(engine, clock, "small", prompt_of("small", 8), max_tokens=2)
    engine.step()
    assert waiting(engine) == ["big"], "a request that fits waited behind one that does not"
    clock.now = PASSED_FOR_S
    later = send(engine, clock, "later", prompt_of("later", 8), max_tokens=2)
    engine.step()
    assert waiting(engine) == ["big", "later"], "the line passed a request for too long"
    admitted: dict[str, int] = {}
    step = 0
    while not all(done(e) for e in (hog, big, small, later)):
        engine.step()
        step += 1
        for name in ("big", "later"):
            if name not in waiting(engine):
                admitted.setdefault(name, step)
    assert all(e[-1].error is None for e in (hog, big, small, later))
    assert admitted["big"] <= admitted["later"]


def test_an_answer_preempted_for_room_is_never_passed_by_newcomers_that_fit(
    served: ServedModel, tmp_path: Path
) -> None:
    # Three answers outgrow the pool: the newest is taken out by a decode that finds it dry.
    # Once the shortest ends, its room fits a newcomer but not the preempted answer's history:
    # the newcomer waits behind the answer anyway (passed by every newcomer that fits, it
    # could wait for ever under a load that never stops).
    engine, _ = make_engine(served, tmp_path, num_blocks=12)
    clock = on_clock(engine)
    short = send(engine, clock, "short", prompt_of("short", 8), max_tokens=12)
    keep = send(engine, clock, "keep", prompt_of("keep", 16), max_tokens=200)
    out = send(engine, clock, "out", prompt_of("out", 16), max_tokens=200)
    while not engine.scheduler.preemptions:
        engine.step()
    assert waiting(engine) == ["out"]
    while not done(short):
        engine.step()
    clock.now += 1.0
    newcomer = send(engine, clock, "new", prompt_of("new", 4), max_tokens=2)
    engine.step()
    fits = engine.scheduler.blocks.fit(seq_of(engine, "new"), len(engine.scheduler.running))
    assert fits.lacking <= 0, "the newcomer should fit the room the short answer left"
    assert waiting(engine) == ["out", "new"]
    streamed = len(tokens(out))
    while "out" in waiting(engine):
        assert "new" in waiting(engine), "the newcomer went ahead of the preempted answer"
        engine.step()
    engine.run_until_idle()
    assert all(e[-1].error is None for e in (short, keep, out, newcomer))
    assert len(tokens(out)) > streamed > 0  # it resumed where it was


def test_a_one_off_takes_agents_cached_pages_once_it_has_waited_while_others_run(
    served: ServedModel, tmp_path: Path
) -> None:
    # Agents' finished turns fill the pool at the working tier, and one agent keeps decoding:
    # a one-off (no agent) that needs their room leaves them alone at first, then takes them
    # (written to disk first) instead of waiting until nothing runs at all.
    engine, _ = make_engine(served, tmp_path, num_blocks=24)
    clock = on_clock(engine)
    histories = {f"agent-{a}": prompt_of(f"agent-{a}", 5 * BLOCK) for a in range(3)}
    for name, history in histories.items():
        send(engine, clock, name, history, max_tokens=1, agent=name)
    engine.run_until_idle()
    working = [b for b in engine.pool.cached_blocks() if engine.pool.tier_of(b)]
    assert {engine.pool.tier_of(b) for b in working} == {TIER_WORKING_AGENT}
    busy = send(engine, clock, "busy", [*histories["agent-0"], 50], 200, agent="agent-0")
    engine.step()
    side_prompt = prompt_of("side", 16 * BLOCK)
    side = send(engine, clock, "side", side_prompt, max_tokens=2)
    engine.step()
    assert waiting(engine) == ["side"], "a fresh one-off took a working agent's pages"
    clock.now = ONE_OFF_PATIENCE_S
    engine.step()
    assert not waiting(engine), "the one-off still waits while the agents' pages sit idle"
    while not done(side):
        engine.step()
    assert not done(busy), "the one-off waited until nothing ran"
    engine.run_until_idle()
    assert tokens(side) == alone(served, tmp_path / "side", side_prompt, 2)
    for name, history in histories.items():  # every history is still there, from disk
        again = send(engine, clock, f"{name}-2", [*history, 60], max_tokens=1, agent=name)
        engine.run_until_idle()
        usage = again[-1].usage
        assert usage is not None and usage.cached_tokens >= 5 * BLOCK - 1


def test_under_a_load_that_never_stops_over_a_tiny_pool_no_request_waits_until_its_timeout(
    served: ServedModel, tmp_path: Path
) -> None:
    # Agents named and anonymous, each sending its next turn the moment its answer ends, and
    # one-offs now and then, over a pool that holds about two of their histories; every step
    # takes 0.1 s of the clock. Every request gets its first token well within the queue
    # timeout, none is refused, and no answer, once it streams, misses more than a few steps.
    timeout_s = 120.0
    engine, _ = make_engine(served, tmp_path, num_blocks=20, queue_timeout_s=timeout_s)
    clock = on_clock(engine)
    reads_at_once(engine)
    histories = {f"agent-{a}": prompt_of(f"agent-{a}", 4 * BLOCK + a) for a in range(6)}
    arrived: dict[str, float] = {}
    times: dict[str, list[float]] = defaultdict(list)
    finals: dict[str, TokenEvent] = {}
    due = list(histories)
    turn_of: dict[str, int] = defaultdict(int)

    def submit(agent: str) -> None:
        turn_of[agent] += 1
        name = f"{agent}/{turn_of[agent]}"
        named = int(agent.rsplit("-", 1)[1]) % 2 == 0
        prompt = [*histories[agent], 200 + turn_of[agent] % 50]
        sampling = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
        request = Request(name, prompt, sampling, agent if named else None, arrival_time=clock.now)

        def sink(event: TokenEvent) -> None:
            times[name] += [clock.now] * len(event.token_ids)
            outputs[name] += event.token_ids
            if event.final:
                finals[name] = event
                histories[agent] = [*prompt, *outputs[name]]
                due.append(agent)

        arrived[name] = clock.now
        engine.submit(request, sink)

    outputs: dict[str, list[int]] = defaultdict(list)
    for step in range(3000):
        for agent in due:
            if len(histories[agent]) > 8 * BLOCK:  # a long conversation starts over
                histories[agent] = prompt_of(f"{agent}-{step}", 4 * BLOCK)
            submit(agent)
        due.clear()
        if step % 40 == 0:  # a one-off: a title, a summary
            send(engine, clock, f"side-{step}", prompt_of(f"side-{step}", 6 * BLOCK), 4)
        engine.step()
        clock.now += 0.1
    assert finals, "nothing finished"
    errors = {name: str(e.error) for name, e in finals.items() if e.error is not None}
    assert not errors, errors
    first_waits = [times[name][0] - arrived[name] for name in times if times[name]]
    unanswered = [clock.now - arrived[name] for name in arrived if not times[name]]
    assert max(first_waits + unanswered) < timeout_s / 8
    gaps = [b - a for ts in times.values() for a, b in itertools.pairwise(ts)]
    assert max(gaps) <= 2.0, "an answer stopped for longer than twenty steps"
    assert min(turn_of.values()) >= 10, "an agent was starved of turns"
    engine.pool.check_integrity()
