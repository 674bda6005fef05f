"""Write-behind: a named agent's turn goes to disk behind it, so a crash (an engine dropped
without its shutdown's persist, its writer flushed as a disk would be) costs the next turn
nothing; the copies are bounded and come after the answer; a partial tail's file is replaced
when the history goes on; the mark of a history that ended on a block boundary goes with it."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from semantic.cache.disk.tier import DiskTier
from semantic.cache.pages.page import PageKV
from semantic.cache.pages.prefix import page_key
from semantic.core import AgentKey, Request, SamplingParams, TokenEvent
from semantic.engine.engine import Engine
from semantic.models.served import ServedModel
from tests.unit.fakes import make_engine
from tests.unit.test_agent_cache import turn

BLOCK = 8  # make_engine's block size
SYSTEM = [3 + (k * 7) % 380 for k in range(5 * BLOCK)]  # five full blocks


def held_disk(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """Every disk write waits (up to 30 s) until the event returned is set."""
    disk_free = threading.Event()
    real_write = DiskTier.write

    def held(self: DiskTier, record: object) -> int:
        disk_free.wait(30)
        return real_write(self, record)  # type: ignore[arg-type]

    monkeypatch.setattr(DiskTier, "write", held)
    return disk_free


def crashed(engine: Engine, served: ServedModel, tmp_path: Path) -> Engine:
    """What a restart after kill -9 finds: `engine` is dropped without its shutdown's persist,
    once the writes queued so far are durable (a kill lands after them)."""
    assert engine.tiering.writer.flush(10)
    return make_engine(served, tmp_path)[0]


def test_a_named_agents_turn_survives_a_crash_and_its_next_turn_reads_it_from_disk(
    served: ServedModel, tmp_path: Path
) -> None:
    engine, _ = make_engine(served, tmp_path)
    prompt = [*SYSTEM, 11, 12, 13]  # five full blocks and a partial one, with the answer
    output, _ = turn(engine, "alice", prompt)
    history = [*prompt, *output]
    restarted = crashed(engine, served, tmp_path)
    assert AgentKey("alice") in restarted.agents.by_key  # its manifest came after its blocks
    _, usage = turn(restarted, "alice", [*history, 300])
    assert usage.cached_tokens == len(history) - 1  # all but the answer's uncomputed last
    assert restarted.agents.stats.counters.hit_tokens_disk == len(history) - 1


def test_only_blocks_the_disk_lacks_are_written_behind(served: ServedModel, tmp_path: Path) -> None:
    engine, _ = make_engine(served, tmp_path)
    history = [*SYSTEM, 11]
    history += turn(engine, "alice", history)[0]
    engine.tiering.writer.flush(10)
    first = engine.tiering.traffic.written_behind
    assert first == len(engine.agents.by_key[AgentKey("alice")].hashes)
    history += [12, 13]
    history += turn(engine, "alice", history)[0]
    engine.tiering.writer.flush(10)
    alice = engine.agents.by_key[AgentKey("alice")]
    new = [h for h in alice.hashes if h not in set(alice.hashes[:5])]  # past the system prompt
    assert engine.tiering.traffic.written_behind - first == len(new)


def test_a_partial_tails_file_is_replaced_once_the_history_after_it_is_on_disk(
    served: ServedModel, tmp_path: Path
) -> None:
    engine, _ = make_engine(served, tmp_path)
    history = [*SYSTEM, 11]
    history += turn(engine, "alice", history, max_tokens=2)[0]  # 43 tokens: a tail of 2
    engine.tiering.writer.flush(10)
    old_tail = engine.agents.by_key[AgentKey("alice")].tail_hash
    assert old_tail is not None and engine.tiering.disk.contains(page_key(old_tail, 0))
    history += [12, 13]
    history += turn(engine, "alice", history, max_tokens=4)[0]  # 49: the block filled
    engine.tiering.writer.flush(10)
    alice = engine.agents.by_key[AgentKey("alice")]
    assert not engine.tiering.disk.contains(page_key(old_tail, 0))
    assert not engine.prefix.contains(old_tail)  # nor in memory, to be evicted and written again
    assert all(engine.tiering.disk.contains(page_key(h, 0)) for h in alice.hashes)
    restarted = crashed(engine, served, tmp_path)
    _, usage = turn(restarted, "alice", [*history, 300])
    assert usage.cached_tokens == len(history) - 1


def test_a_tail_another_agent_still_names_keeps_its_file(
    served: ServedModel, tmp_path: Path
) -> None:
    engine, _ = make_engine(served, tmp_path)
    history = [*SYSTEM, 11]
    history += turn(engine, "alice", history, max_tokens=2)[0]
    engine.agents.fork(AgentKey("alice"), AgentKey("bob"))
    shared_tail = engine.agents.by_key[AgentKey("bob")].tail_hash
    assert shared_tail is not None
    turn(engine, "alice", [*history, 12, 13], max_tokens=4)
    engine.tiering.writer.flush(10)
    assert engine.tiering.disk.contains(page_key(shared_tail, 0))  # bob's next turn reads it


def test_the_mark_of_a_history_that_ended_on_a_block_boundary_survives_a_crash(
    served: ServedModel, tmp_path: Path
) -> None:
    # 41 prompt tokens and 8 answer tokens: the history computes six whole blocks, no tail.
    engine, _ = make_engine(served, tmp_path)
    prompt = [*SYSTEM, 11]
    history = [*prompt, *turn(engine, "alice", prompt, max_tokens=8)[0]]
    alice = engine.agents.by_key[AgentKey("alice")]
    assert alice.tail_hash is None and alice.num_tokens == 6 * BLOCK
    last = alice.block_hashes[-1]
    restarted = crashed(engine, served, tmp_path)
    assert restarted.tiering.disk.ends_history(page_key(last, 0))
    assert restarted.prefix.match([*history, 13], restarted.prefix.root).extends_history
    _, usage = turn(restarted, "alice", [*history, 13])
    assert usage.cached_tokens == len(history) - 1


def test_an_anonymous_request_is_not_written_behind(served: ServedModel, tmp_path: Path) -> None:
    engine, _ = make_engine(served, tmp_path)
    turn(engine, None, [*SYSTEM, 11])
    engine.tiering.writer.flush(10)
    assert engine.tiering.traffic.written_behind == 0
    assert engine.tiering.disk.stats.files == 0


def test_the_answer_goes_out_before_any_page_is_copied(served: ServedModel, tmp_path: Path) -> None:
    engine, _ = make_engine(served, tmp_path)
    order: list[str] = []
    read_page = engine.tiering.read_page  # the runner's, copying a page out of the pool

    def reading(block: int) -> PageKV:
        order.append("copy")
        return read_page(block)

    engine.tiering.read_page = reading
    request = Request("r", [*SYSTEM, 11], SamplingParams(temperature=0.0, max_tokens=6), "alice")
    engine.submit(request, lambda event: order.append("final" if event.final else "token"))
    engine.run_until_idle()
    assert order.index("final") < order.index("copy")
    assert order.count("copy") == len(engine.agents.by_key[AgentKey("alice")].hashes)


def test_a_slow_disk_holds_back_the_write_behind_never_the_engine(
    served: ServedModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine, _ = make_engine(served, tmp_path, num_blocks=64)
    page_bytes = engine.tiering.disk.spec.bytes_per_page
    engine.write_behind.max_queued_bytes = 2 * page_bytes
    engine.write_behind.step_bytes = page_bytes
    disk_free = held_disk(monkeypatch)
    try:
        request = Request("a", [*SYSTEM, 11], SamplingParams(temperature=0.0, max_tokens=6), "a")
        done: list[TokenEvent] = []
        engine.submit(request, done.append)
        for _ in range(40):  # the turn runs to its end, and the engine goes on stepping
            engine.step()
        assert done and done[-1].final and done[-1].error is None
        assert engine.tiering.writer.queued_bytes <= 2 * page_bytes
        assert engine.write_behind.pending  # the rest waits for the disk
        output, _ = turn_while_stuck(engine, [*SYSTEM[:8], 50, 51])
        assert output  # another agent is served meanwhile
    finally:
        disk_free.set()
    engine.run_until_idle()
    engine.tiering.writer.flush(10)
    alice = engine.agents.by_key[AgentKey("a")]
    assert all(engine.tiering.disk.contains(page_key(h, 0)) for h in alice.hashes)


def turn_while_stuck(engine: Engine, prompt: list[int]) -> tuple[list[int], TokenEvent]:
    """A one-off request stepped to its end (not `run_until_idle`, which would wait for the
    write-behind that the stuck disk holds)."""
    events: list[TokenEvent] = []
    request = Request("b", prompt, SamplingParams(temperature=0.0, max_tokens=4))
    engine.submit(request, events.append)
    for _ in range(40):
        engine.step()
        if events and events[-1].final:
            break
    assert events and events[-1].final and events[-1].error is None
    return [t for e in events for t in e.token_ids], events[-1]


def test_past_its_bound_the_oldest_waiting_turn_is_dropped_and_a_newer_one_replaces_its_own(
    served: ServedModel, tmp_path: Path
) -> None:
    engine, _ = make_engine(served, tmp_path)
    for name in ("a", "b"):
        turn(engine, name, [*SYSTEM, 11])
    engine.write_behind.max_waiting = 1
    a, b = (engine.agents.by_key[AgentKey(name)] for name in ("a", "b"))
    engine.write_behind.turn_ended(a)
    engine.write_behind.turn_ended(a)  # a newer turn of a: one entry still
    assert engine.tiering.traffic.write_behind_dropped == 0
    engine.write_behind.turn_ended(b)  # past the bound: a's is dropped
    assert engine.tiering.traffic.write_behind_dropped == 1 and engine.write_behind.pending
    engine.run_until_idle()
    assert not engine.write_behind.pending


def test_a_deleted_agents_blocks_stay_deleted_when_a_write_behind_lands_after(
    served: ServedModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine, _ = make_engine(served, tmp_path)
    disk_free = held_disk(monkeypatch)
    request = Request("r", [*SYSTEM, 11], SamplingParams(temperature=0.0, max_tokens=6), "alice")
    engine.submit(request, lambda event: None)
    engine.step()
    while engine.scheduler.has_work or engine.write_behind.pending:
        engine.step()  # until the turn's pages are queued; the disk holds them there
    alice = engine.agents.by_key[AgentKey("alice")]
    engine.agents.delete(AgentKey("alice"))
    disk_free.set()
    assert engine.tiering.writer.flush(10)
    assert not any(engine.tiering.disk.contains(page_key(h, 0)) for h in alice.hashes)
    assert not list(engine.tiering.disk.blocks_dir.glob("*.safetensors"))


def test_a_history_computed_again_after_its_agent_was_deleted_is_kept_when_old_writes_land(
    served: ServedModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A deleted agent's pages, whose writes are still queued, count as gone at once: the
    same history computed again (the client sends its conversation to a new agent of the
    same name) is written behind again and saved when the pool reclaims it, rather than
    skipped as on disk, so the delete that runs behind the old writes cannot take it."""
    engine, _ = make_engine(served, tmp_path)
    disk_free = held_disk(monkeypatch)
    prompt = [*SYSTEM, 11]
    output, _ = turn(engine, "alice", prompt)  # its pages wait in the writer's queue
    engine.agents.delete(AgentKey("alice"))
    assert output == turn(engine, "alice", prompt)[0]  # the same history, a new agent
    alice = engine.agents.by_key[AgentKey("alice")]
    engine.pool.release(engine.pool.allocate(engine.pool.num_available()))  # memory pressure
    disk_free.set()
    assert engine.tiering.writer.flush(10)
    keys = engine.prefix.history_keys(alice.hashes, alice.num_tokens)
    assert all(engine.tiering.disk.contains(key) for key in keys)
    _, usage = turn(engine, "alice", [*prompt, *output, 300])
    assert usage.cached_tokens == len(prompt) + len(output) - 1
