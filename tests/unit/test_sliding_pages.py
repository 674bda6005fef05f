"""Sliding layer groups keep only their window: through the engine and a fake runner with
sliding layers, a history holds every full-attention page and a window of each sliding group's,
in memory and on disk; what left the window is reclaimed first and never written; continuations
read back from memory, disk and a restart give the answers a cache-less engine gives."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from semantic.cache.block_pool import TIER_OUT_OF_WINDOW
from semantic.core import FinishReason, Request, SamplingParams, TokenEvent
from semantic.engine.engine import Engine
from semantic.models.served import ServedModel
from tests.unit.fakes import make_engine

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
    assert engine.agents.persist(["alice"], timeout=10).failed == 0
    assert engine.agents.evict(["alice"]) > 0
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
    described = engine.agents.describe("alice")
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
            assert engine.agents.persist([victim], timeout=10).failed == 0
            engine.agents.evict([victim])
        if rng.random() < 0.2:
            engine.stop()
            restored += engine.tiering.traffic.restored
            reclaimed += sum(engine.pool.reclaimed)
            engine, _ = make_engine(served, tmp_path, num_blocks=40, layer_windows=windows)
    engine.tiering.disk._index.check_integrity()
    assert restored + engine.tiering.traffic.restored > 0
    assert reclaimed + sum(engine.pool.reclaimed) > 0, "no memory pressure"
