"""Sliding layer groups keep only their window: through the engine and a fake runner with
sliding layers, a history holds every full-attention page and a window of each sliding group's,
in memory and on disk; what left the window is reclaimed first and never written; continuations
read back from memory, disk and a restart give the answers a cache-less engine gives."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from semantic.cache.pages.block_pool import TIER_OUT_OF_WINDOW
from semantic.cache.pages.prefix import page_key, split_key
from semantic.core import (
    AgentKey,
    FinishReason,
    Request,
    SamplingParams,
    TokenEvent,
    first_read_block,
)
from semantic.engine.engine import Engine
from semantic.models.served import ServedModel
from semantic.text.tokenizer import Tokenizer
from tests.unit.fakes import fake_served, make_engine

BLOCK = 8  # make_engine's block size
WINDOW = 12
HYBRID = (None, WINDOW, WINDOW, WINDOW)  # one full-attention layer, three sliding
SLIDING = (WINDOW,)  # every layer slides: no page reads every block


def turn(engine: Engine, name: str, prompt: list[int], agent: str | None, max_tokens: int = 6):
    events: list[TokenEvent] = []
    sampling = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    engine.submit(Request(name, list(prompt), sampling, agent), events.append)
    engine.run_until_idle()
    engine.pool.check_integrity()
    engine.prefix.check_integrity()
    assert events[-1].error is None and events[-1].usage is not None, events[-1].error
    return [t for e in events for t in e.token_ids], events[-1].usage


def fresh(served: ServedModel, tmp_path: Path, windows: tuple, prompt: list[int], n: int = 6):
    engine, _ = make_engine(served, tmp_path / "fresh", num_blocks=512, layer_windows=windows)
    return turn(engine, "fresh", prompt, None, n)[0]


@pytest.mark.parametrize("windows", [HYBRID, SLIDING], ids=["hybrid", "all-sliding"])
@pytest.mark.parametrize("extra", [1, 2, 3, 7])  # where each turn's history ends in its block
def test_a_continuation_after_evict_and_restart_gives_the_answers_of_no_cache(
    served: ServedModel, tmp_path: Path, windows: tuple, extra: int
) -> None:
    engine, _ = make_engine(served, tmp_path, num_blocks=256, layer_windows=windows)
    prompt = [3 + k % 300 for k in range(10 * BLOCK + extra)]
    answer, _ = turn(engine, "t1", prompt, "alice")
    history = [*prompt, *answer]
    assert engine.agents.persist([AgentKey("alice")], timeout=10).failed == 0
    assert engine.agents.evict([AgentKey("alice")]) > 0
    follow_up = [*history, 301, 302]
    out, usage = turn(engine, "t2", follow_up, "alice")
    assert usage.cached_tokens == len(history) - 1
    assert out == fresh(served, tmp_path, windows, follow_up)
    engine.stop()
    restarted, _ = make_engine(served, tmp_path, num_blocks=256, layer_windows=windows)
    history = [*follow_up, *out]
    last = [*history, 303]
    out, usage = turn(restarted, "t3", last, "alice")
    assert usage.cached_tokens == len(history) - 1
    assert out == fresh(served, tmp_path, windows, last)


def window_pages(windows: tuple, num_tokens: int) -> int:
    """Pages a history of `num_tokens` tokens needs: every block in a full-attention layer
    group, the blocks its window reads in a sliding one (the fake's groups are one layer)."""
    blocks = -(-num_tokens // BLOCK)
    first = [0 if w is None else max(0, num_tokens - w + 1) // BLOCK for w in windows]
    return sum(blocks - f for f in first)


def test_a_long_history_holds_every_block_of_the_full_group_and_a_window_of_the_others(
    served: ServedModel, tmp_path: Path
) -> None:
    engine, runner = make_engine(served, tmp_path, num_blocks=256, layer_windows=HYBRID)
    prompt = [3 + k % 300 for k in range(40 * BLOCK + 5)]
    answer, _ = turn(engine, "t1", prompt, "alice", max_tokens=20)
    computed = len(prompt) + len(answer) - 1  # the last answer token has no KV yet
    needed = window_pages(HYBRID, computed)
    assert needed < 0.3 * len(HYBRID) * -(-computed // BLOCK)  # a fraction of full attention
    page, full = runner.cache_spec.bytes_per_page, runner.cache_spec.bytes_per_block
    described = engine.agents.describe(engine.agents.by_key[AgentKey("alice")])
    assert described is not None and described["bytes_in_memory"] == needed * page
    assert described["bytes_full_attention"] == -(-computed // BLOCK) * full
    kept = [p for p in engine.pool.cached_blocks() if engine.pool.tier_of(p) != TIER_OUT_OF_WINDOW]
    assert len(kept) == needed  # the rest of the pool is free or out of every window
    assert engine.agents.persist(timeout=10).failed == 0
    assert engine.tiering.disk.stats.files == needed  # out-of-window pages are never written


def reclaim_out_of_window_pages(engine: Engine) -> int:
    """Memory pressure: take every free page and every page cached out of its window (which
    the pool reclaims first), and give them back empty. Returns how many were reclaimed."""
    pool = engine.pool
    dropped = sum(pool.tier_of(p) == TIER_OUT_OF_WINDOW for p in pool.cached_blocks())
    pool.release(pool.allocate(pool.num_free + dropped))
    assert not any(pool.tier_of(p) == TIER_OUT_OF_WINDOW for p in pool.cached_blocks())
    return dropped


@pytest.mark.parametrize("windows", [HYBRID, SLIDING], ids=["hybrid", "all-sliding"])
def test_a_prefix_whose_window_pages_are_gone_is_cut_back_to_one_that_has_them(
    served: ServedModel, tmp_path: Path, windows: tuple
) -> None:
    """Another agent shares the first 20 blocks of a 40-block history: while the pages of the
    window at that point are cached (out of the window) it reuses them; once memory pressure
    took them it cannot (K/V of a sliding layer cannot be recomputed alone), and starts over
    from where its windows are whole. A prompt continuing the history still reuses it all."""
    engine, _ = make_engine(served, tmp_path, num_blocks=256, layer_windows=windows)
    first = [3 + k % 300 for k in range(40 * BLOCK)]
    history = [*first, *turn(engine, "t1", first, "alice", max_tokens=1)[0]]
    shared = history[: 20 * BLOCK]
    prompt = [*shared, 301, 302, 303]
    out, usage = turn(engine, "t2", prompt, "bob")
    assert usage.cached_tokens == len(shared)
    assert out == fresh(served, tmp_path, windows, prompt)
    assert reclaim_out_of_window_pages(engine) > 0
    other = [*shared[:-BLOCK], 304, 305]  # bob's own blocks do not cover this one
    out, usage = turn(engine, "t3", other, "carol")
    assert usage.cached_tokens == 0  # every block before bob's window lost its sliding pages
    assert out == fresh(served, tmp_path, windows, other)
    follow_up = [*history, 306]
    out, usage = turn(engine, "t4", follow_up, "alice")
    assert usage.cached_tokens == len(history) - 1
    assert out == fresh(served, tmp_path, windows, follow_up)


def test_a_prompt_longer_than_the_pool_holds_at_full_attention_runs_in_a_window(
    served: ServedModel, tmp_path: Path
) -> None:
    # 40 pages of 4 groups hold 10 blocks (80 tokens) of every layer; windowed, the full
    # group's page per block is what grows.
    engine, _ = make_engine(served, tmp_path, num_blocks=40, layer_windows=HYBRID)
    prompt = [3 + k % 300 for k in range(17 * BLOCK + 3)]
    assert engine.max_seq_tokens > len(prompt) + 6 > 10 * BLOCK
    out, _ = turn(engine, "long", prompt, None)
    assert out == fresh(served, tmp_path, HYBRID, prompt)


@pytest.mark.parametrize("windows", [HYBRID, SLIDING], ids=["hybrid", "all-sliding"])
def test_a_forks_window_stays_when_its_parent_answers_past_it(
    served: ServedModel, tmp_path: Path, windows: tuple
) -> None:
    """Alice is forked as bob; her next turn moves her window past the one they share. Under
    memory pressure bob's first turn must still find all of it."""
    engine, _ = make_engine(served, tmp_path, num_blocks=256, layer_windows=windows)
    prompt = [3 + k % 300 for k in range(10 * BLOCK + 3)]
    history = [*prompt, *turn(engine, "a1", prompt, "alice")[0]]
    engine.agents.fork(AgentKey("alice"), AgentKey("bob"))
    onward = [*history, *(3 + (k * 7) % 300 for k in range(3 * BLOCK))]
    turn(engine, "a2", onward, "alice")
    reclaim_out_of_window_pages(engine)
    again = [*history, 304, 305]
    out, usage = turn(engine, "b1", again, "bob")
    assert usage.cached_tokens == len(history) - 1
    assert out == fresh(served, tmp_path, windows, again)


@pytest.mark.parametrize("windows", [HYBRID, SLIDING], ids=["hybrid", "all-sliding"])
def test_a_forks_partial_tail_stays_when_its_parent_goes_on_by_a_token(
    served: ServedModel, tmp_path: Path, windows: tuple
) -> None:
    """Alice is forked as bob, their history on disk; alice goes on by a token, so the only
    page her window leaves is the partial tail they shared, which her history no longer
    names, and then on past the tail that turn left. Bob still reads the first: its file
    must stay."""
    engine, _ = make_engine(served, tmp_path, num_blocks=256, layer_windows=windows)
    prompt = [3 + k % 300 for k in range(10 * BLOCK - 2)]
    history = [*prompt, *turn(engine, "a1", prompt, "alice")[0]]  # 10 blocks and 4 tokens
    engine.agents.fork(AgentKey("alice"), AgentKey("bob"))
    engine.agents.persist()
    engine.agents.evict()
    onward = [*history, 303]
    onward += turn(engine, "a2", onward, "alice", max_tokens=1)[0]
    engine.agents.persist()
    turn(engine, "a3", [*onward, *range(310, 310 + 2 * BLOCK)], "alice")  # past a2's tail
    engine.agents.persist()
    engine.agents.evict()
    reclaim_out_of_window_pages(engine)
    again = [*history, 304, 305]
    out, usage = turn(engine, "b1", again, "bob")
    assert usage.cached_tokens == len(history) - 1
    assert out == fresh(served, tmp_path, windows, again)


@pytest.mark.parametrize("windows", [HYBRID, SLIDING], ids=["hybrid", "all-sliding"])
@pytest.mark.parametrize("restart", [False, True], ids=["in-memory", "after-a-restart"])
def test_a_turn_sent_again_after_an_aborted_one_reuses_the_whole_history(
    served: ServedModel, tmp_path: Path, windows: tuple, restart: bool
) -> None:
    """A client that stops an answer (Esc in Claude Code, a dropped connection) sends its
    conversation again without it. The aborted turn's window moved past the history's, and
    memory pressure (or a restart) took what it left behind; the history's own window must
    still be there, or a hybrid model recomputes the whole conversation."""
    engine, _ = make_engine(served, tmp_path, num_blocks=256, layer_windows=windows)
    prompt = [3 + k % 300 for k in range(10 * BLOCK + 3)]
    history = [*prompt, *turn(engine, "t1", prompt, "alice")[0]]
    assert engine.agents.persist([AgentKey("alice")], timeout=10).failed == 0
    events: list[TokenEvent] = []
    long_message = [*history, *(3 + (k * 7) % 300 for k in range(3 * BLOCK))]
    sampling = SamplingParams(temperature=0.0, max_tokens=4 * BLOCK)
    engine.submit(Request("t2", long_message, sampling, "alice"), events.append)
    while not any(e.token_ids for e in events):
        engine.step()
    engine.abort("t2")
    engine.run_until_idle()
    assert events[-1].finish_reason is FinishReason.ABORT
    if restart:
        engine.stop()
        engine, _ = make_engine(served, tmp_path, num_blocks=256, layer_windows=windows)
    else:
        reclaim_out_of_window_pages(engine)
    again = [*history, 304, 305]
    out, usage = turn(engine, "t3", again, "alice")
    assert usage.cached_tokens == len(history) - 1
    assert out == fresh(served, tmp_path, windows, again)


@pytest.mark.parametrize(
    "windows",
    [HYBRID, SLIDING, (None, 5, 20, 20, 5, None)],
    ids=["hybrid", "all-sliding", "two-windows"],
)
def test_random_turns_forks_aborts_evictions_and_restarts_keep_pool_and_answers_right(
    served: ServedModel, tmp_path: Path, windows: tuple
) -> None:
    rng = random.Random(sum(w or 0 for w in windows))
    engine, _ = make_engine(served, tmp_path, num_blocks=40, layer_windows=windows)
    histories: dict[str, list[int]] = {}
    restored = reclaimed = 0  # pages read back from disk, and reclaimed, over every engine
    for step in range(14):
        requests = []
        for n in range(rng.randint(1, 4)):
            agent = rng.choice(["a", "b", "c", "d"])
            base = histories.get(rng.choice([agent, *histories]), [])
            base = base[: rng.randint(0, len(base))] if rng.random() < 0.3 else base  # a fork
            prompt = [*base, *(rng.randrange(3, 400) for _ in range(rng.randint(1, 30)))]
            if len(prompt) > 120:
                prompt = prompt[-rng.randint(20, 60) :]  # a new conversation
            events: list[TokenEvent] = []
            sampling = SamplingParams(temperature=0.0, max_tokens=rng.randint(1, 12))
            engine.submit(Request(f"{step}-{n}", prompt, sampling, agent), events.append)
            requests.append((agent, prompt, sampling.max_tokens, events))
        if rng.random() < 0.3:  # one is cancelled mid-way
            engine.step()
            engine.abort(f"{step}-0")
        engine.run_until_idle()
        engine.pool.check_integrity()
        engine.prefix.check_integrity()
        for agent, prompt, max_tokens, events in requests:
            assert events[-1].error is None
            if events[-1].finish_reason is not FinishReason.ABORT:
                out = [t for e in events for t in e.token_ids]
                assert out == fresh(served, tmp_path / str(step), windows, prompt, max_tokens)
                histories[agent] = [*prompt, *out]
        if rng.random() < 0.3:
            victim = rng.choice(list(histories))
            assert engine.agents.persist([AgentKey(victim)], timeout=10).failed == 0
            engine.agents.evict([AgentKey(victim)])
        if rng.random() < 0.2:
            engine.stop()
            restored += engine.tiering.traffic.restored
            reclaimed += sum(engine.pool.reclaimed)
            engine, _ = make_engine(served, tmp_path, num_blocks=40, layer_windows=windows)
    engine.tiering.disk._index.check_integrity()
    assert restored + engine.tiering.traffic.restored > 0
    assert reclaimed + sum(engine.pool.reclaimed) > 0, "no memory pressure"


def window_keys(engine: Engine, agent: str) -> set[int]:
    """The sliding groups' page keys of the blocks an agent's window reads, from its history."""
    found = engine.agents.by_key[AgentKey(agent)]
    hashes, num_tokens = found.hashes, found.num_tokens
    keys = set()
    for group, window in enumerate(engine.prefix.windows):
        if window is not None:
            first = first_read_block(window, num_tokens, BLOCK)
            keys |= {page_key(h, group) for h in hashes[first:]}
    return keys


def sliding_keys_kept(engine: Engine) -> tuple[set[int], set[int]]:
    """The sliding groups' page keys cached in memory (but those out of the window), and on
    disk."""
    pool, windows = engine.pool, engine.prefix.windows
    memory = set()
    for page in pool.cached_blocks():
        key = pool.hash_of(page)
        if key is not None and pool.tier_of(page) != TIER_OUT_OF_WINDOW:
            memory.add(key)
    disk = set()
    for path in engine.tiering.disk.blocks_dir.glob("*.safetensors"):  # not a write's temp file
        block_hash, _, group = path.name.removesuffix(".safetensors").partition("-")
        disk.add(page_key(int(block_hash, 16), int(group or 0)))
    return (
        {k for k in memory if windows[split_key(k)[1]]},
        {k for k in disk if windows[split_key(k)[1]]},
    )


def test_a_history_persisted_at_every_turn_keeps_one_window_of_sliding_pages(
    served: ServedModel, tmp_path: Path
) -> None:
    """Alice is persisted after every turn (and once evicted, so a turn restores its window).
    The sliding pages her window moved past leave memory's working tiers and the disk, turn
    after turn, but those bob's history (forked from hers) still reads; both continue after a
    restart with what they had."""
    engine, _ = make_engine(served, tmp_path, num_blocks=256, layer_windows=HYBRID)
    histories: dict[str, list[int]] = {"alice": []}
    for n in range(4):
        prompt = [*histories["alice"], *(3 + (n * 50 + k) % 300 for k in range(6 * BLOCK + 3))]
        histories["alice"] = [*prompt, *turn(engine, f"a{n}", prompt, "alice")[0]]
        if n == 0:  # bob forks: his window reads a block hers is about to move past
            fork = [*histories["alice"], 301, 302]
            histories["bob"] = [*fork, *turn(engine, "b0", fork, "bob")[0]]
            assert engine.agents.persist([AgentKey("bob")], timeout=10).failed == 0
        assert engine.agents.persist([AgentKey("alice")], timeout=10).failed == 0
        if n == 1:
            assert engine.agents.evict([AgentKey("alice")]) > 0  # the next turn restores her window
        memory, disk = sliding_keys_kept(engine)
        windows = window_keys(engine, "alice") | window_keys(engine, "bob")
        assert memory <= windows and disk == windows, n
    assert window_keys(engine, "alice").isdisjoint(window_keys(engine, "bob"))
    alice = engine.agents.by_key[AgentKey("alice")]
    keys = {k for h in alice.hashes for k in engine.prefix.keys(h)}
    kept_for_bob = keys & window_keys(engine, "bob")
    assert kept_for_bob  # her blocks' sliding pages that only bob's window still reads
    on_disk = [k for k in keys if engine.tiering.contains(k)]
    assert len(on_disk) == window_pages(HYBRID, len(histories["alice"]) - 1) + len(kept_for_bob)
    engine.stop()
    restarted, _ = make_engine(served, tmp_path, num_blocks=256, layer_windows=HYBRID)
    for agent in ("alice", "bob"):
        follow_up = [*histories[agent], 307]
        out, usage = turn(restarted, f"{agent}-after", follow_up, agent)
        assert usage.cached_tokens == len(histories[agent]) - 1
        assert out == fresh(served, tmp_path, HYBRID, follow_up)


def test_a_pinned_agent_holds_its_window_and_lets_go_of_what_it_passed(
    served: ServedModel, tmp_path: Path
) -> None:
    engine, _ = make_engine(served, tmp_path, num_blocks=256, layer_windows=HYBRID)
    history: list[int] = []
    for n in range(3):
        prompt = [*history, *(3 + (n * 70 + k) % 300 for k in range(5 * BLOCK + 1))]
        history = [*prompt, *turn(engine, f"t{n}", prompt, "alice")[0]]
        if n == 0:  # pinning needs the agent, which its first turn makes
            engine.agents.pin(AgentKey("alice"))
        assert engine.pool.num_held == window_pages(HYBRID, len(history) - 1), n
        memory, _ = sliding_keys_kept(engine)
        assert memory <= window_keys(engine, "alice"), n  # the rest: out of the window
    engine.agents.pin(AgentKey("alice"), pinned=False)
    assert engine.pool.num_held == 0
    out, usage = turn(engine, "after", [*history, 308], "alice")
    assert usage.cached_tokens == len(history) - 1
    assert out == fresh(served, tmp_path, HYBRID, [*history, 308])


# Gemma 3 270M's layers: five sliding (a 512-token window) then one global, three times.
GEMMA3_270M = ((512,) * 5 + (None,)) * 3


def test_gemma3_270m_holds_at_most_a_quarter_of_full_attention_at_16k_tokens_of_history(
    tiny_tokenizer: Tokenizer, tmp_path: Path
) -> None:
    """A 16K-token history over Gemma 3 270M's layers and 256-token blocks, in a pool of 128
    pages: full attention would need 6 pages a block (390), the windowed history fits. What
    /admin/cache reports for it, in memory and on disk, is at most a quarter of every layer's
    K/V."""
    served = fake_served(tiny_tokenizer, context=20_000)
    engine, runner = make_engine(
        served,
        tmp_path,
        num_blocks=128,
        block_tokens=256,
        layer_windows=GEMMA3_270M,
        max_batch_tokens=512,
    )
    prompt = [3 + k % 397 for k in range(16_384)]
    history = [*prompt, *turn(engine, "long", prompt, "alice", max_tokens=4)[0]]
    assert len(history) - 1 > 16_384 and 6 * -(-len(history) // 256) > engine.pool.num_blocks
    assert engine.agents.persist([AgentKey("alice")], timeout=30).failed == 0
    alice = engine.agents.by_key[AgentKey("alice")]
    agent = engine.agents.describe(alice)  # what /admin/cache reports for her
    assert agent["cached_tokens"] == len(history) - 1
    assert agent["bytes_in_memory"] <= agent["bytes_full_attention"] / 4
    page, pages_per_block = runner.cache_spec.bytes_per_page, len(runner.cache_spec.groups)
    pool = engine.pool
    kept = [p for p in pool.cached_blocks() if pool.tier_of(p) != TIER_OUT_OF_WINDOW]
    assert len(kept) * page == agent["bytes_in_memory"]  # the rest is free or out of window
    files = sum(
        engine.tiering.contains(k) for h in alice.hashes for k in engine.prefix.keys(h)
    )  # fmt: skip
    assert files * page == agent["bytes_in_memory"]
    assert files <= len(alice.hashes) * pages_per_block / 4
