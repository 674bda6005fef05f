"""The agent cache through the engine and the fake runner: reuse across turns, eviction to disk,
restarts, and failure modes 1, 3, 5 and 6 of docs/failure_modes.md. The fake runner computes
each token from the context it reads back through the block tables, so a wrong restore changes
outputs."""

from __future__ import annotations

import asyncio
import errno
from pathlib import Path

import pytest

from semantic.cache.agents.stats import MISS_CORRUPT, MISS_EVICTED, MISS_OTHER_MODEL
from semantic.cache.disk.tier import DiskTier
from semantic.core import AgentKey, Request, SamplingParams, TokenEvent, Usage
from semantic.engine.engine import Engine
from semantic.errors import PinLimit
from semantic.models.served import ServedModel
from tests.unit.fakes import fake_served, make_engine

SYSTEM = [3 + (k * 7) % 380 for k in range(40)]  # five full 8-token blocks


def turn(
    engine: Engine, agent: str | None, prompt: list[int], max_tokens: int = 6, prefetch: bool = True
) -> tuple[list[int], Usage]:
    """One request through the engine (disk prefetch included); its output and usage."""
    request = Request(
        f"{agent}-{len(prompt)}-{id(prompt)}",
        list(prompt),
        SamplingParams(temperature=0.0, max_tokens=max_tokens),
        agent_id=agent,
    )
    events: list[TokenEvent] = []
    engine.submit(request, events.append)
    engine.run_until_idle()
    engine.pool.check_integrity()
    engine.prefix.check_integrity()
    assert events[-1].usage is not None and events[-1].error is None
    return [t for e in events for t in e.token_ids], events[-1].usage


def conversation(engine: Engine, agent: str, turns: int) -> list[int]:
    """Several turns of one agent; returns the last prompt's history (prompt + answer)."""
    history = list(SYSTEM)
    for i in range(turns):
        history += [200 + sum(map(ord, agent)) % 50, 201 + i]  # str hashes change per process
        output, _ = turn(engine, agent, history)
        history += output
    return history


def fresh_answer(served: ServedModel, tmp_path: Path, prompt: list[int]) -> list[int]:
    engine, _ = make_engine(served, tmp_path / "fresh")
    return turn(engine, None, prompt)[0]


def test_a_continuing_agent_prefills_only_its_new_tokens(
    served: ServedModel, tmp_path: Path
) -> None:
    engine, runner = make_engine(served, tmp_path)
    history = conversation(engine, "alice", 2)
    prompt = [*history, 300, 301, 302]
    output, usage = turn(engine, "alice", prompt)
    assert usage.cached_tokens == len(history) - 1  # all but the answer's last (uncomputed) token
    prefilled = sum(len(i.token_ids) for i in runner.steps[-(usage.completion_tokens) :][0].items)
    assert prefilled == len(prompt) - usage.cached_tokens
    assert output == fresh_answer(served, tmp_path, prompt)


def test_ten_agents_share_one_copy_of_a_system_prompt_in_memory_and_on_disk(
    served: ServedModel, tmp_path: Path
) -> None:
    engine, _ = make_engine(served, tmp_path, num_blocks=64)
    for agent in range(10):
        _, usage = turn(engine, f"agent-{agent}", [*SYSTEM, 300 + agent, 301])
        assert usage.cached_tokens == (0 if agent == 0 else 40)
    system_hashes = engine.agents.by_key[AgentKey("agent-0")].block_hashes[:5]
    for agent in range(10):
        assert engine.agents.by_key[AgentKey(f"agent-{agent}")].block_hashes[:5] == system_hashes
    blocks = [engine.pool.lookup(h) for h in system_hashes]
    assert None not in blocks and len(set(blocks)) == 5
    engine.stop()
    files = list((engine.tiering.disk.blocks_dir).glob("*.safetensors"))
    names = {int(f.stem, 16) for f in files}
    assert set(system_hashes) <= names
    assert len(files) == len(names)  # content-addressed: each block once


def test_evicted_blocks_come_back_from_disk_and_change_nothing(
    served: ServedModel, tmp_path: Path
) -> None:
    engine, _ = make_engine(served, tmp_path, num_blocks=12)
    history = conversation(engine, "alice", 1)
    for other in range(4):  # push alice's blocks out of the 12-block pool
        turn(engine, f"other-{other}", [100 + other] * 60)
    engine.tiering.writer.flush(10)
    traffic = engine.tiering.traffic
    assert traffic.evicted_to_disk + traffic.written_behind > 0  # behind her turn, or evicted
    prompt = [*history, 300]
    output, usage = turn(engine, "alice", prompt)
    assert usage.cached_tokens == len(history) - 1
    assert engine.agents.by_key[AgentKey("alice")].stats.disk_hit_tokens > 0
    assert output == fresh_answer(served, tmp_path, prompt)


def test_evict_frees_only_blocks_on_disk_and_the_next_turn_reads_them_back(
    served: ServedModel, tmp_path: Path
) -> None:
    engine, _ = make_engine(served, tmp_path)
    alice, bob = conversation(engine, "alice", 2), conversation(engine, "bob", 1)
    private = set(engine.agents.by_key[AgentKey("alice")].hashes) - set(
        engine.agents.by_key[AgentKey("bob")].hashes
    )
    assert engine.agents.evict([AgentKey("alice")]) == 0  # nothing on disk yet: nothing may go
    assert engine.agents.persist([AgentKey("alice")], timeout=10).failed == 0
    free_before = engine.pool.num_free
    evicted = engine.agents.evict([AgentKey("alice")])
    assert evicted == len(engine.agents.by_key[AgentKey("alice")].hashes) > len(private)
    assert engine.pool.num_free == free_before + evicted
    assert all(
        engine.pool.lookup(h) is None for h in engine.agents.by_key[AgentKey("alice")].hashes
    )
    assert engine.tiering.traffic.evicted_on_request == evicted
    prompt = [*alice, 300]
    output, usage = turn(engine, "alice", prompt)
    assert usage.cached_tokens == len(alice) - 1
    assert engine.agents.by_key[AgentKey("alice")].stats.disk_hit_tokens == len(alice) - 1
    assert output == fresh_answer(served, tmp_path, prompt)
    _, usage = turn(engine, "bob", [*bob, 300])  # the shared prefix came back for alice
    assert usage.cached_tokens == len(bob) - 1


def test_evict_keeps_a_pinned_agents_blocks(served: ServedModel, tmp_path: Path) -> None:
    engine, _ = make_engine(served, tmp_path)
    conversation(engine, "vip", 1)
    engine.agents.pin(AgentKey("vip"))
    engine.agents.persist(timeout=10)
    assert engine.agents.evict() == 0
    assert None not in [engine.pool.lookup(h) for h in engine.agents.by_key[AgentKey("vip")].hashes]


def test_after_a_restart_the_first_turn_reads_its_cache_from_disk(
    served: ServedModel, tmp_path: Path
) -> None:
    engine, _ = make_engine(served, tmp_path)
    history = conversation(engine, "alice", 2)
    engine.stop()  # graceful: persists every hot block and the manifests
    restarted, _ = make_engine(served, tmp_path)
    assert restarted.agents.by_key[AgentKey("alice")].num_tokens == len(history) - 1
    prompt = [*history, 300, 301]
    output, usage = turn(restarted, "alice", prompt)
    assert usage.cached_tokens == len(history) - 1
    assert restarted.agents.stats.counters.hit_tokens_disk == usage.cached_tokens
    assert output == fresh_answer(served, tmp_path, prompt)


@pytest.mark.parametrize("damage", ["truncate", "flip", "empty"])
def test_a_damaged_block_file_is_a_quarantined_miss_with_the_right_output(
    served: ServedModel, tmp_path: Path, damage: str
) -> None:
    engine, _ = make_engine(served, tmp_path)
    history = conversation(engine, "alice", 1)
    engine.stop()
    first = engine.agents.by_key[AgentKey("alice")].block_hashes[0]
    path = engine.tiering.disk.blocks_dir / f"{first:016x}.safetensors"
    data = path.read_bytes()
    if damage == "truncate":
        path.write_bytes(data[: len(data) // 2])
    elif damage == "flip":
        path.write_bytes(data[:-5] + bytes([data[-5] ^ 0x40]) + data[-4:])
    else:
        path.write_bytes(b"")
    restarted, _ = make_engine(served, tmp_path)
    prompt = [*history, 300]
    output, usage = turn(restarted, "alice", prompt)
    assert usage.cached_tokens == 0
    assert restarted.agents.stats.counters.miss_reasons[MISS_CORRUPT] == 1
    assert list(restarted.tiering.disk.quarantine_dir.iterdir())
    assert output == fresh_answer(served, tmp_path, prompt)


def test_another_models_cache_is_never_loaded(tiny_tokenizer: object, tmp_path: Path) -> None:
    first = fake_served(tiny_tokenizer, name="model-a")  # type: ignore[arg-type]
    engine, _ = make_engine(first, tmp_path)
    history = conversation(engine, "alice", 1)
    engine.stop()
    other, _ = make_engine(fake_served(tiny_tokenizer, name="model-b"), tmp_path)  # type: ignore[arg-type]
    _, usage = turn(other, "alice", [*history, 300])
    assert usage.cached_tokens == 0
    assert other.agents.stats.counters.miss_reasons[MISS_OTHER_MODEL] == 1


def lose_everything(engine: Engine) -> None:
    """Other agents' prompts push every block out of a 12-block pool, and the disk keeps none
    of them."""
    engine.tiering.disk.budget_bytes = 0
    for other in range(4):
        turn(engine, f"other-{other}", [100 + other] * 60)
    engine.tiering.writer.flush(10)


def test_a_history_evicted_from_memory_and_disk_is_a_miss_named_evicted(
    served: ServedModel, tmp_path: Path
) -> None:
    engine, _ = make_engine(served, tmp_path, num_blocks=12, disk_budget_mb=1)
    history = conversation(engine, "alice", 1)
    lose_everything(engine)
    _, usage = turn(engine, "alice", [*history, 300])
    assert usage.cached_tokens == 0
    assert engine.agents.by_key[AgentKey("alice")].stats.miss_reasons[MISS_EVICTED] == 1


def test_disk_full_while_persisting_keeps_serving_and_loses_nothing_acknowledged(
    served: ServedModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine, _ = make_engine(served, tmp_path)
    alice = conversation(engine, "alice", 1)
    assert engine.agents.persist([AgentKey("alice")], timeout=10).failed == 0  # acknowledged

    def full(self: DiskTier, record: object) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(DiskTier, "write", full)
    conversation(engine, "bob", 1)  # the writes behind his turn fail
    engine.tiering.writer.flush(10)
    errors_before = engine.tiering.traffic.write_errors
    result = engine.agents.persist([AgentKey("bob")], timeout=10)
    assert result.failed > 0 and result.agents_saved == 0
    assert engine.tiering.traffic.write_errors - errors_before == result.failed
    output, _ = turn(engine, "carol", [*SYSTEM, 9, 9])  # still serving
    assert output
    monkeypatch.undo()
    engine.stop()
    restarted, _ = make_engine(served, tmp_path)
    _, usage = turn(restarted, "alice", [*alice, 300])
    assert usage.cached_tokens == len(alice) - 1


def test_a_reload_larger_than_the_free_pool_restores_what_fits(
    served: ServedModel, tmp_path: Path
) -> None:
    engine, _ = make_engine(served, tmp_path, num_blocks=32)
    history = conversation(engine, "alice", 3)  # about 70 tokens: 9 blocks
    engine.stop()
    small, _ = make_engine(served, tmp_path, num_blocks=12)
    turn(small, "hog", [50] * 40, max_tokens=1)  # 5 blocks cached for another agent
    restored_before = small.agents.stats.counters.hit_tokens_disk
    prompt = [*history, 300]
    output, usage = turn(small, "alice", prompt)
    assert 0 < usage.cached_tokens <= len(history) - 1
    assert small.agents.stats.counters.hit_tokens_disk > restored_before
    assert output == fresh_answer(served, tmp_path, prompt)


def test_two_requests_creating_the_same_agent_at_once(served: ServedModel, tmp_path: Path) -> None:
    engine, _ = make_engine(served, tmp_path)

    async def both() -> list[list[TokenEvent]]:
        async def one(i: int) -> list[TokenEvent]:
            request = Request(
                f"twin-{i}",
                [*SYSTEM, 7, i + 3],
                SamplingParams(temperature=0.0, max_tokens=4),
                agent_id="twin",
            )
            return [event async for event in engine.stream(request)]

        return list(await asyncio.gather(one(0), one(1)))

    engine.start()
    try:
        results = asyncio.run(both())
    finally:
        engine.stop()
    assert all(r[-1].usage is not None and r[-1].error is None for r in results)
    assert list(engine.agents.by_key) == [AgentKey("twin")]
    assert engine.agents.by_key[AgentKey("twin")].stats.requests == 2
    assert engine.pool.num_held == 0


def test_a_pinned_agent_keeps_its_cache_in_memory_under_pressure(
    served: ServedModel, tmp_path: Path
) -> None:
    engine, _ = make_engine(served, tmp_path, num_blocks=16)
    history = conversation(engine, "vip", 1)
    engine.agents.pin(AgentKey("vip"))
    for other in range(6):  # far more than the pool holds
        turn(engine, f"other-{other}", [100 + other] * 60)
    pinned_blocks = [engine.pool.lookup(h) for h in engine.agents.by_key[AgentKey("vip")].hashes]
    assert None not in pinned_blocks
    _, usage = turn(engine, "vip", [*history, 300])
    assert usage.cached_tokens == len(history) - 1
    assert engine.agents.by_key[AgentKey("vip")].stats.disk_hit_tokens == 0  # all from memory
    engine.agents.pin(AgentKey("vip"), False)
    engine.pool.check_integrity()


def test_a_turn_served_from_memory_counts_no_disk_hits(served: ServedModel, tmp_path: Path) -> None:
    engine, _ = make_engine(served, tmp_path)
    history = conversation(engine, "alice", 2)
    _, usage = turn(engine, "alice", [*history, 300])
    assert usage.cached_tokens == len(history) - 1
    assert engine.agents.stats.counters.hit_tokens_disk == 0
    assert engine.agents.by_key[AgentKey("alice")].stats.disk_hit_tokens == 0


def test_sharer_counts_keep_only_hashes_an_agent_still_uses(
    served: ServedModel, tmp_path: Path
) -> None:
    engine, _ = make_engine(served, tmp_path)
    conversation(engine, "alice", 3)  # each turn replaces alice's partial tail
    conversation(engine, "bob", 2)
    sharers = engine.agents.registry._sharers  # the counts themselves: none left behind
    in_use = {h for agent in engine.agents.by_key.values() for h in agent.hashes}
    assert set(sharers) == in_use and all(count > 0 for count in sharers.values())
    engine.agents.delete(AgentKey("alice"))
    engine.agents.delete(AgentKey("bob"))
    assert not sharers


def test_an_agent_deleted_while_another_computes_its_prefix_leaves_that_prefix_cached(
    served: ServedModel, tmp_path: Path
) -> None:
    """Two agents prefill the same prompt at once: the first to fill a block indexes it, the
    other's copy stays unindexed. Deleting the first agent while the second still runs drops
    the indexed copy (no agent names it yet); the second's copy must take its place, or the
    history it leaves names blocks that exist nowhere and its next turn starts cold."""
    engine, _ = make_engine(served, tmp_path)
    sampling = SamplingParams(temperature=0.0, max_tokens=1)
    first, second = [], []  # type: list[TokenEvent], list[TokenEvent]
    engine.submit(Request("a", list(SYSTEM), sampling, agent_id="alice"), first.append)
    longer = SamplingParams(temperature=0.0, max_tokens=6)
    engine.submit(Request("b", list(SYSTEM), longer, agent_id="bob"), second.append)
    while not (first and first[-1].final):
        engine.step()
    assert not (second and second[-1].final), "bob's answer must still be running"
    engine.agents.delete(AgentKey("alice"))
    engine.run_until_idle()
    history = [*SYSTEM, *(t for e in second for t in e.token_ids)]
    _, usage = turn(engine, "bob", [*history, 300])
    assert usage.cached_tokens == len(history) - 1


def test_a_key_pins_at_most_its_share_of_the_pool(served: ServedModel, tmp_path: Path) -> None:
    engine, _ = make_engine(served, tmp_path, num_blocks=16, max_pinned_share=0.5)
    conversation(engine, "vip", 1)  # 6 of the pool's 16 blocks
    conversation(engine, "vip-2", 1)
    engine.agents.pin(AgentKey("vip"))
    with pytest.raises(PinLimit, match="50%"):
        engine.agents.pin(AgentKey("vip-2"))
    assert not engine.agents.by_key[AgentKey("vip-2")].pinned
    assert engine.pool.num_held == 6
    engine.agents.pin(AgentKey("vip"), False)
    engine.agents.pin(AgentKey("vip-2"))  # room again once the other lets go
    assert engine.pool.num_held == 6


def test_pins_let_go_of_memory_for_a_request_that_could_not_run_beside_them(
    served: ServedModel, tmp_path: Path
) -> None:
    """Pins may hold most of the pool; a prompt that needs more than the rest does not wait
    for ever: the pins let go of their pages (their files stay), it runs, and the pinned
    agent's next turn still finds its whole history, from disk."""
    engine, _ = make_engine(served, tmp_path, num_blocks=16, max_pinned_share=1.0)
    history = conversation(engine, "vip", 1)  # 6 blocks, held by the pin
    engine.agents.pin(AgentKey("vip"))
    output, usage = turn(engine, None, [100] * 90)  # 12 blocks: more than the 10 left
    assert usage.prompt_tokens == 90 and output
    _, usage = turn(engine, "vip", [*history, 300])
    assert usage.cached_tokens == len(history) - 1
    vip = engine.agents.by_key[AgentKey("vip")]
    assert vip.pinned and engine.pool.num_held == len(vip.hashes)  # it holds its pages again
