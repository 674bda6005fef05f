"""The agent cache under concurrent pressure, through the engine and the fake runner: more agents
at once than the pool holds restore their warm turns from disk instead of recomputing them; a
restore that cannot fit waits; preempted sequences resume from their cache; a one-off that waits
for agents' room lets their turns pass for a while; conversations without a name rank as working
agents. The fake runner computes each token from the context it reads back
through the block tables, so a wrong restore changes outputs."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from semantic.cache.agents.stats import MISS_EVICTED
from semantic.cache.pages.block_pool import (
    TIER_IDLE_AGENT,
    TIER_ONE_OFF,
    TIER_OUT_OF_WINDOW,
    TIER_WORKING_AGENT,
)
from semantic.cache.pages.prefix import page_key
from semantic.core import AgentKey, Request, SamplingParams, TokenEvent, Usage
from semantic.engine.engine import Engine
from semantic.engine.scheduler import PASSED_FOR_S
from semantic.models.served import ServedModel
from tests.unit.fakes import make_engine

BLOCK = 8  # make_engine's block size


def system_prompt(agent: int) -> list[int]:
    """Five full blocks of an agent's own system prompt."""
    return [3 + (agent * 31 + k * 7) % 380 for k in range(5 * BLOCK)]


def run_at_once(
    engine: Engine, prompts: dict[str, list[int]], named: bool, max_tokens: int = 6
) -> dict[str, tuple[list[int], Usage]]:
    """Submit one request per agent together, run the engine until all are done; each one's
    output and usage. Checks the pool and the prefix index after."""
    events: dict[str, list[TokenEvent]] = {agent: [] for agent in prompts}
    for agent, prompt in prompts.items():
        sampling = SamplingParams(temperature=0.0, max_tokens=max_tokens)
        request = Request(
            f"{agent}-{len(prompt)}", list(prompt), sampling, agent if named else None
        )
        engine.submit(request, events[agent].append)
    engine.run_until_idle()
    engine.pool.check_integrity()
    engine.prefix.check_integrity()
    out = {}
    for agent, got in events.items():
        assert got[-1].error is None and got[-1].usage is not None, got[-1].error
        out[agent] = ([t for e in got for t in e.token_ids], got[-1].usage)
    return out


def conversations(
    engine: Engine, agents: int, turns: int, named: bool
) -> list[dict[str, tuple[int, int, Usage]]]:
    """`turns` rounds of every agent at once; per round and agent: the tokens its history had
    before the turn, the prompt's length and the usage."""
    histories = {f"agent-{a}": system_prompt(a) for a in range(agents)}
    rounds = []
    for turn in range(turns):
        prompts = {a: [*h, 200 + turn, 201] for a, h in histories.items()}
        results = run_at_once(engine, prompts, named)
        rounds.append({a: (len(histories[a]), len(prompts[a]), u) for a, (_, u) in results.items()})
        histories = {a: [*prompts[a], *results[a][0]] for a in histories}
    return rounds


# A model with sliding layers, as the fake runner has them (one full-attention layer and three
# with a window of 12 tokens: a block takes four pages, one per layer group); its pools are
# sized so that it is as short of room as the plain model's.
HYBRID = {"layer_windows": (None, 12, 12, 12), "num_blocks": 48}
PLAIN = {"num_blocks": 24}


@pytest.mark.parametrize("named", [True, False], ids=["named", "anonymous"])
@pytest.mark.parametrize("model", [PLAIN, HYBRID], ids=["plain", "hybrid"])
def test_more_agents_at_once_than_the_pool_holds_restore_warm_turns_from_disk(
    served: ServedModel, tmp_path: Path, named: bool, model: dict[str, Any]
) -> None:
    # Six agents of ~7 blocks each at the end over a 24-block pool: they cannot all stay.
    engine, _ = make_engine(served, tmp_path, **model)
    for rounds in conversations(engine, 6, 3, named)[1:]:
        for history, prompt, usage in rounds.values():
            assert usage.cached_tokens >= history - 1  # all but the answer's uncomputed last
            assert usage.prompt_tokens - usage.cached_tokens <= prompt - history + 1
    assert engine.tiering.traffic.restored > 0, "no warm turn needed the disk"
    assert engine.agents.stats.counters.hit_tokens_disk > 0
    assert engine.pool.num_held == 0


@pytest.mark.parametrize("named", [True, False], ids=["named", "anonymous"])
@pytest.mark.parametrize("model", [PLAIN, HYBRID], ids=["plain", "hybrid"])
def test_under_pressure_every_answer_is_the_one_a_roomy_pool_gives(
    served: ServedModel, tmp_path: Path, named: bool, model: dict[str, Any]
) -> None:
    def answers(engine: Engine) -> list[list[int]]:
        histories = {f"agent-{a}": system_prompt(a) for a in range(6)}
        out = []
        for turn in range(3):
            prompts = {a: [*h, 200 + turn, 201] for a, h in histories.items()}
            results = run_at_once(engine, prompts, named)
            out += [results[a][0] for a in sorted(results)]
            histories = {a: [*prompts[a], *results[a][0]] for a in histories}
        return out

    windows = model.get("layer_windows", ())
    small, _ = make_engine(served, tmp_path / "small", **model)
    roomy, _ = make_engine(served, tmp_path / "roomy", num_blocks=1024, layer_windows=windows)
    assert answers(small) == answers(roomy)


def submit(engine: Engine, name: str, prompt: list[int], agent: str | None, max_tokens: int = 6):
    """Submit one request; returns the list its events land in."""
    events: list[TokenEvent] = []
    sampling = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    engine.submit(Request(name, list(prompt), sampling, agent), events.append)
    return events


def result(events: list[TokenEvent]) -> tuple[list[int], Usage]:
    assert events and events[-1].error is None and events[-1].usage is not None
    return [t for e in events for t in e.token_ids], events[-1].usage


def alone(served: ServedModel, tmp_path: Path, prompt: list[int], max_tokens: int) -> list[int]:
    engine, _ = make_engine(served, tmp_path / "alone", num_blocks=256)
    events = submit(engine, "alone", prompt, None, max_tokens)
    engine.run_until_idle()
    return result(events)[0]


def test_a_restore_that_cannot_fit_waits_instead_of_recomputing(
    served: ServedModel, tmp_path: Path
) -> None:
    engine, _ = make_engine(served, tmp_path, num_blocks=16)
    history = system_prompt(1)
    first = submit(engine, "alice-1", history, "alice", max_tokens=1)
    engine.run_until_idle()
    assert engine.agents.persist([AgentKey("alice")], timeout=10).failed == 0
    assert engine.agents.evict([AgentKey("alice")]) > 0  # alice's cache is on disk only
    hog = submit(engine, "hog", [7] * 100, "hog", max_tokens=20)  # 13 of 16 blocks
    engine.step()
    prompt = [*history, *result(first)[0], 300]
    back = submit(engine, "alice-2", prompt, "alice")
    engine.run_until_idle()
    output, usage = result(back)
    assert usage.cached_tokens == len(prompt) - 2  # everything computed before
    assert engine.agents.by_key[AgentKey("alice")].stats.disk_hit_tokens == usage.cached_tokens
    assert output == alone(served, tmp_path, prompt, 6)
    assert result(hog)[0] == alone(served, tmp_path, [7] * 100, 20)


def test_a_preempted_sequence_resumes_from_its_cache_with_the_tokens_it_gets_alone(
    served: ServedModel, tmp_path: Path
) -> None:
    # Two sequences that each fit alone but outgrow the pool together while decoding: the
    # newer is preempted, its blocks are reclaimed (so they go to disk) and it comes back.
    engine, runner = make_engine(served, tmp_path, num_blocks=12)
    prompts = {"a": [5] * 30, "b": [6] * 30}
    events = {name: submit(engine, name, p, None, max_tokens=50) for name, p in prompts.items()}
    engine.run_until_idle()
    for name, prompt in prompts.items():
        assert result(events[name])[0] == alone(served, tmp_path / name, prompt, 50)
    starts = [item for batch in runner.steps for item in batch.items if item.start_pos == 0]
    assert len(starts) == 2, "a preempted sequence was computed again from its start"
    assert engine.tiering.traffic.restored > 0
    assert engine.pool.num_held == 0


def test_a_running_sequences_growth_takes_an_idle_agents_blocks_before_a_waiting_agents(
    served: ServedModel, tmp_path: Path
) -> None:
    engine, _ = make_engine(served, tmp_path, num_blocks=20, agent_idle_s=60)
    idle = submit(engine, "idle-1", system_prompt(1), "idle", max_tokens=1)
    engine.run_until_idle()
    engine.agents.sweep(now=engine.agents.by_key[AgentKey("idle")].stats.last_used + 120)
    waiter = submit(engine, "waiter-1", system_prompt(2), "waiter", max_tokens=1)
    engine.run_until_idle()
    idle_hashes = engine.agents.by_key[AgentKey("idle")].hashes
    assert {engine.pool.tier_of(engine.pool.lookup(h) or 0) for h in idle_hashes} == {
        TIER_IDLE_AGENT
    }
    hog = submit(engine, "hog", [7] * 80, "hog", max_tokens=12)  # every free block, growing
    engine.step()
    prompt = [*system_prompt(2), *result(waiter)[0], *range(300, 340)]
    back = submit(engine, "waiter-2", prompt, "waiter")  # lacks room while the hog runs
    engine.step()
    assert engine.scheduler.waiting, "the waiter did not have to wait"
    while engine.scheduler.waiting:
        waiter_hashes = engine.agents.by_key[AgentKey("waiter")].hashes
        assert all(engine.pool.lookup(h) is not None for h in waiter_hashes)
        engine.step()
    assert any(engine.pool.lookup(h) is None for h in idle_hashes), "nothing was reclaimed"
    engine.run_until_idle()
    output, usage = result(back)
    assert usage.cached_tokens == 5 * BLOCK
    assert (
        engine.agents.by_key[AgentKey("waiter")].stats.disk_hit_tokens == 0
    )  # all still in memory
    assert output == alone(served, tmp_path, prompt, 6)
    assert result(hog)[0] == alone(served, tmp_path / "hog", [7] * 80, 12)
    result(idle)


Events = list[TokenEvent]


def one_off_ahead_of_a_turn(
    served: ServedModel, tmp_path: Path, waited_s: float
) -> tuple[Engine, Events, Events, Events]:
    """Agents' histories fill most of the pool and one agent keeps decoding; then a one-off that
    needs their room (having waited `waited_s`) and, behind it, another agent's turn that fits.
    Returns the engine and the three requests' events, after one step; the scheduler's clock
    stands still from then on (a loaded machine's steps never make the one-off patient)."""
    engine, _ = make_engine(served, tmp_path, num_blocks=24)
    run_at_once(engine, {f"agent-{a}": system_prompt(a) for a in range(3)}, named=True)
    busy = submit(engine, "busy", [*system_prompt(0), 50, 51], "agent-0", max_tokens=30)
    engine.step()
    side: list[TokenEvent] = []
    one_off = [3 + (k * 13) % 380 for k in range(18 * BLOCK)]
    now = time.monotonic()
    engine.scheduler.clock = lambda: now
    arrived = now - waited_s
    engine.submit(Request("side", one_off, SamplingParams(temperature=0.0, max_tokens=6),
                          arrival_time=arrived), side.append)  # fmt: skip
    turn = submit(engine, "turn", [*system_prompt(1), 60, 61], "agent-1")
    engine.step()
    return engine, busy, side, turn


def test_a_one_off_waiting_for_agents_room_does_not_hold_up_an_agents_turn_behind_it(
    served: ServedModel, tmp_path: Path
) -> None:
    # A side request leaves working agents' pages alone for its first second, so the one-off
    # waits; the agent's turn behind it used to wait with it until nothing ran at all.
    engine, busy, side, turn = one_off_ahead_of_a_turn(served, tmp_path, waited_s=0.0)
    assert [seq.request.request_id for seq in engine.scheduler.waiting] == ["side"]
    first: dict[str, int] = {}
    for step in range(100):
        engine.step()
        first |= {
            name: step for name, e in (("side", side), ("turn", turn)) if e and name not in first
        }
        if busy[-1:] and busy[-1].usage is not None:
            break
    assert "turn" in first and "side" not in first, "the agent's turn waited behind the one-off"
    engine.scheduler.clock = time.monotonic
    engine.run_until_idle()  # the one-off, once it has waited ONE_OFF_PATIENCE_S
    for events in (busy, side, turn):
        result(events)


def test_a_one_off_passed_for_long_enough_holds_the_line_again_and_is_not_starved(
    served: ServedModel, tmp_path: Path
) -> None:
    engine, busy, side, turn = one_off_ahead_of_a_turn(served, tmp_path, PASSED_FOR_S)
    assert [seq.request.request_id for seq in engine.scheduler.waiting] == ["side", "turn"]
    engine.run_until_idle()
    for events in (busy, side, turn):
        result(events)


def test_an_anonymous_prompt_that_extends_a_history_whole_is_cached_as_a_working_agent(
    served: ServedModel, tmp_path: Path
) -> None:
    engine, _ = make_engine(served, tmp_path)
    first_prompt = [*system_prompt(3), 11]
    first = submit(engine, "turn-1", first_prompt, None)
    one_off = submit(engine, "one-off", [*system_prompt(4), 12], None)
    engine.run_until_idle()
    history = [*first_prompt, *result(first)[0]]
    second = submit(engine, "turn-2", [*history, 13], None)
    engine.run_until_idle()
    assert result(second)[1].cached_tokens == len(history) - 1
    conversation = engine.prefix.match([*history, 13, 14], engine.prefix.root)
    assert {engine.pool.tier_of(b) for b in conversation.in_memory} == {TIER_WORKING_AGENT}
    side = engine.prefix.match([*system_prompt(4), 12, *result(one_off)[0], 15], engine.prefix.root)
    assert {engine.pool.tier_of(b) for b in side.in_memory} == {TIER_ONE_OFF}


def test_an_anonymous_history_that_ends_on_a_block_boundary_is_still_a_working_agents(
    served: ServedModel, tmp_path: Path
) -> None:
    # 41 prompt tokens and 8 answer tokens: the history computes 48, six whole blocks, and
    # leaves no partial tail to match; its next turn used to count as a one-off.
    engine, _ = make_engine(served, tmp_path)
    first_prompt = [*system_prompt(5), 11]
    first = submit(engine, "turn-1", first_prompt, None, max_tokens=8)
    engine.run_until_idle()
    history = [*first_prompt, *result(first)[0]]
    assert (len(history) - 1) % BLOCK == 0
    next_turn = engine.prefix.match([*history, 13], engine.prefix.root)
    assert next_turn.tail_hash is None and next_turn.extends_history
    second = submit(engine, "turn-2", [*history, 13], None)
    engine.run_until_idle()
    assert result(second)[1].cached_tokens == len(history) - 1
    conversation = engine.prefix.match([*history, 13, 14], engine.prefix.root)
    assert {engine.pool.tier_of(b) for b in conversation.in_memory} == {TIER_WORKING_AGENT}
    # a prompt that shares the blocks but where no history ended is still not a conversation
    assert not engine.prefix.match([*system_prompt(5), 99, 98], engine.prefix.root).extends_history


def boundary_history(
    served: ServedModel, tmp_path: Path, model: dict[str, Any] = PLAIN
) -> tuple[list[int], list[int]]:
    """(first prompt, history) of an anonymous turn whose history computes six whole blocks
    (41 prompt tokens, 8 answer tokens, the last not computed), as `model` answers it."""
    first_prompt = [*system_prompt(5), 11]
    windows = model.get("layer_windows", ())
    probe, _ = make_engine(served, tmp_path / "probe", num_blocks=256, layer_windows=windows)
    answer = submit(probe, "probe", first_prompt, None, max_tokens=8)
    probe.run_until_idle()
    history = [*first_prompt, *result(answer)[0]]
    assert (len(history) - 1) % BLOCK == 0
    return first_prompt, history


def push_out_of_the_pool(engine: Engine, block_hash: int) -> None:
    """Fill the pool with one-offs until the block's pages went to disk."""
    for other in range(3):
        submit(engine, f"other-{other}", [100 + other] * 60, None, max_tokens=1)
        engine.run_until_idle()
    engine.tiering.writer.flush(10)
    assert not engine.prefix.contains(block_hash)
    assert engine.tiering.disk.contains(page_key(block_hash, 0))


def computed_by_a_side_request(engine: Engine, history: list[int]) -> int:
    """A side request computes the blocks of `history` (its own last tokens differ); the hash of
    the last full one, where the history ends."""
    submit(engine, "side", [*history[:-1], 7, 7], None, max_tokens=1)
    engine.run_until_idle()
    return engine.prefix.match([*history, 13], engine.prefix.root).hashes[-1]


def assert_a_conversations_turn(engine: Engine, history: list[int]) -> None:
    """The next turn of `history` is known as a conversation's and runs as one, its whole
    history reused: cached at the working agents' tier, not as a one-off."""
    assert engine.prefix.match([*history, 13], engine.prefix.root).extends_history
    turn = submit(engine, "turn-2", [*history, 13], None)
    engine.run_until_idle()
    assert result(turn)[1].cached_tokens == len(history) - 1
    engine.prefix.check_integrity()
    conversation = engine.prefix.match([*history, 13, 14], engine.prefix.root)
    tiers = {engine.pool.tier_of(b) for b in conversation.in_memory}
    assert tiers - {TIER_OUT_OF_WINDOW} == {TIER_WORKING_AGENT}  # windows leave pages behind


SMALL_PLAIN = {"num_blocks": 16}
SMALL_HYBRID = {"layer_windows": (None, 12, 12, 12), "num_blocks": 36}


@pytest.mark.parametrize("model", [SMALL_PLAIN, SMALL_HYBRID], ids=["plain", "hybrid"])
def test_a_history_that_ended_on_a_block_boundary_is_still_one_after_its_block_went_to_disk(
    served: ServedModel, tmp_path: Path, model: dict[str, Any]
) -> None:
    # The mark of where it ended used to leave with the block's pages: the next turn of a
    # conversation whose history went to disk counted as a one-off.
    first_prompt, history = boundary_history(served, tmp_path, model)
    engine, _ = make_engine(served, tmp_path / "cache", **model)
    submit(engine, "turn-1", first_prompt, None, max_tokens=8)
    engine.run_until_idle()
    last = engine.prefix.match([*history, 13], engine.prefix.root).hashes[-1]
    push_out_of_the_pool(engine, last)
    match = engine.prefix.match([*history, 13], engine.prefix.root)
    assert match.tail_hash is None and match.hashes[-1] == last and match.extends_history
    assert engine.tiering.disk.ends_history(page_key(last, 0))
    assert_a_conversations_turn(engine, history)
    assert engine.prefix.marks_history_end(page_key(last, 0))  # restored with its mark
    assert engine.tiering.traffic.restored > 0


def test_a_history_that_ended_on_a_block_boundary_is_still_one_after_a_restart(
    served: ServedModel, tmp_path: Path
) -> None:
    first_prompt, history = boundary_history(served, tmp_path)
    engine, _ = make_engine(served, tmp_path / "cache")
    submit(engine, "turn-1", first_prompt, None, max_tokens=8)
    engine.run_until_idle()
    engine.stop()  # persists every hot block, with its mark
    restarted, _ = make_engine(served, tmp_path / "cache")
    assert_a_conversations_turn(restarted, history)
    assert restarted.agents.stats.counters.hit_tokens_disk == len(history) - 1


def test_a_history_that_ends_on_a_block_the_disk_has_already_marks_it_there(
    served: ServedModel, tmp_path: Path
) -> None:
    # A side request computed and persisted the blocks first; the conversation's turn then
    # ends on one of them, which the disk has unmarked and the pool never saves again.
    first_prompt, history = boundary_history(served, tmp_path)
    engine, _ = make_engine(served, tmp_path / "cache", num_blocks=16)
    last = computed_by_a_side_request(engine, history)
    engine.agents.persist()
    assert not engine.tiering.disk.ends_history(page_key(last, 0))
    turn = submit(engine, "turn-1", first_prompt, None, max_tokens=8)
    engine.run_until_idle()
    assert result(turn)[0] == history[len(first_prompt) :]
    push_out_of_the_pool(engine, last)
    assert engine.tiering.disk.ends_history(page_key(last, 0))
    assert_a_conversations_turn(engine, history)


def test_a_history_that_ends_on_a_block_only_the_disk_has_is_marked_on_disk(
    served: ServedModel, tmp_path: Path
) -> None:
    _, history = boundary_history(served, tmp_path)
    engine, _ = make_engine(served, tmp_path / "cache", num_blocks=16)
    last = computed_by_a_side_request(engine, history)
    push_out_of_the_pool(engine, last)
    assert not engine.prefix.match([*history, 13], engine.prefix.root).extends_history
    engine.prefix.end_history(last)
    engine.stop()  # lets the mark reach the file
    restarted, _ = make_engine(served, tmp_path / "cache")
    assert restarted.tiering.disk.ends_history(page_key(last, 0))
    assert_a_conversations_turn(restarted, history)


def test_an_anonymous_conversations_partial_last_block_is_found_on_disk_after_a_restart(
    served: ServedModel, tmp_path: Path
) -> None:
    engine, _ = make_engine(served, tmp_path)
    prompt = [*system_prompt(5), 21, 22, 23]  # five full blocks and a partial one
    first = submit(engine, "turn-1", prompt, None)
    engine.run_until_idle()
    engine.stop()  # persists every hot block, partial ones too
    restarted, _ = make_engine(served, tmp_path)
    history = [*prompt, *result(first)[0]]
    second = submit(restarted, "turn-2", [*history, 24], None)
    restarted.run_until_idle()
    output, usage = result(second)
    assert usage.cached_tokens == len(history) - 1
    assert restarted.agents.stats.counters.hit_tokens_disk == usage.cached_tokens
    assert output == alone(served, tmp_path / "alone-2", [*history, 24], 6)


def test_an_anonymous_warm_turn_whose_history_left_the_disk_names_its_miss_evicted(
    served: ServedModel, tmp_path: Path
) -> None:
    engine, _ = make_engine(served, tmp_path, num_blocks=12)
    engine.tiering.disk.budget_bytes = 0  # nothing survives on disk
    prompt = [*system_prompt(6), 31]
    first = submit(engine, "turn-1", prompt, None)
    engine.run_until_idle()
    for other in range(3):
        submit(engine, f"other-{other}", [100 + other] * 60, None, max_tokens=1)
        engine.run_until_idle()
    engine.tiering.writer.flush(10)
    second = submit(engine, "turn-2", [*prompt, *result(first)[0], 32], None)
    engine.run_until_idle()
    assert result(second)[1].cached_tokens == 0
    assert engine.agents.stats.counters.miss_reasons[MISS_EVICTED] == 1


def test_a_one_off_request_takes_idle_cached_agent_blocks_when_nothing_runs(
    served: ServedModel, tmp_path: Path
) -> None:
    # Agents' histories fill the pool, cached at the working tier; then a one-off request whose
    # prompt needs most of the pool arrives while nothing runs. It used to wait until the
    # agents went idle (agent_idle_s, 300 s by default): the server idled with work waiting.
    # Now it waits ONE_OFF_PATIENCE_S (a burst of side requests still leaves agents alone).
    engine, _ = make_engine(served, tmp_path, num_blocks=24)
    agents = {f"agent-{a}": system_prompt(a) for a in range(4)}  # 4 × 6 blocks: the pool
    run_at_once(engine, agents, named=True)
    working = [
        b for b in engine.pool.cached_blocks() if engine.pool.tier_of(b) == TIER_WORKING_AGENT
    ]
    assert len(working) >= 20
    one_off = [3 + (k * 13) % 380 for k in range(20 * BLOCK)]
    ((out, usage),) = run_at_once(engine, {"side": one_off}, named=False).values()
    assert len(out) == 6 and usage.prompt_tokens == len(one_off)
