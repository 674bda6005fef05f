"""The agent cache with real model code: tiny random-weight models of the families with
sliding windows, through the engine (full attention has the SmolLM2 engine tests). A
continuation after the cache went to disk and came back (evicted; a restart) gives
transformers' greedy tokens, and so do prefix hits whose matched length ends inside a sliding
window and beyond it. A sliding layer group keeps only its window's pages, in memory and on
disk."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from semantic.cache.pages.block_pool import TIER_OUT_OF_WINDOW
from semantic.core import AgentKey, Request, SamplingParams, TokenEvent, Usage, first_read_block
from semantic.engine.engine import Engine
from semantic.engine.wiring import build_engine
from semantic.models.served import ServedModel
from semantic.settings.options import engine_options
from semantic.settings.settings import Settings
from semantic.text.chat import CHATML_TEMPLATE, ChatTemplate
from semantic.text.tokenizer import Tokenizer
from tests.integration.reference_models import BLOCK_TOKENS, NEEDS_MLX, Model
from tests.integration.test_families_vs_transformers import FAMILIES, VOCAB, WINDOW

pytestmark = pytest.mark.integration

# (family, path): our CPU kernels for each, the stock torch path (CUDA's) for Gemma 3, whose
# windowed views read the sliding groups' tables from their window on, and the MLX backend.
CACHED_FAMILIES = [
    ("gemma3", "cpu"),
    ("gpt_oss", "cpu"),
    ("mistral_sliding", "cpu"),
    ("smollm3_sliding", "cpu"),
    ("gemma3", "cpu-stock"),
    ("gemma3", "mlx"),
    ("gpt_oss", "mlx"),
]
STEPS = 32


@pytest.fixture(
    scope="module",
    params=[
        pytest.param(case, marks=[NEEDS_MLX] if case[1] == "mlx" else [], id="-".join(case))
        for case in CACHED_FAMILIES
    ],
)
def model(request: pytest.FixtureRequest) -> Model:
    family, path = request.param
    build: Callable[[], torch.nn.Module] = FAMILIES[family]
    torch.manual_seed(0)
    return Model(path, build(), vocab=VOCAB)


def engine(model: Model, tiny_tokenizer: Tokenizer, cache_dir: Path) -> Engine:
    template = ChatTemplate(CHATML_TEMPLATE, bos_token=None, eos_token=None)
    served = ServedModel("tiny", model.config, tiny_tokenizer, template, 512, "random-weights")
    settings = Settings(max_batch_tokens=24, batch_window_ms=0, cache_dir=cache_dir)
    return build_engine(model.make_runner("float32"), served, engine_options(settings))


def turn(engine: Engine, agent: str | None, prompt: list[int]) -> tuple[list[int], Usage]:
    """One greedy request of STEPS tokens through the engine."""
    params = SamplingParams(temperature=0.0, max_tokens=STEPS, ignore_eos=True)
    request = Request(f"{agent}-{len(prompt)}", list(prompt), params, agent_id=agent)
    events: list[TokenEvent] = []
    engine.submit(request, events.append)
    engine.run_until_idle()
    engine.pool.check_integrity()
    assert events[-1].usage is not None and events[-1].error is None
    return [t for e in events for t in e.token_ids], events[-1].usage


def assert_reference_greedy(model: Model, prompt: list[int], out: list[int]) -> None:
    assert out == model.reference_after(prompt, out).argmax(-1).tolist()


def test_a_continuation_read_back_from_disk_gives_the_reference_tokens(
    model: Model, tiny_tokenizer: Tokenizer, tmp_path: Path
):
    first = engine(model, tiny_tokenizer, tmp_path)
    prompt = model.prompt(3 * BLOCK_TOKENS + 5, 1)  # history longer than the window
    answer, _ = turn(first, "alice", prompt)
    assert_reference_greedy(model, prompt, answer)
    history = [*prompt, *answer]
    assert first.agents.persist([AgentKey("alice")], timeout=30).failed == 0
    assert first.agents.evict([AgentKey("alice")]) > 0  # every block of alice's now only on disk
    follow_up = [*history, 7, 8, 9]
    out, usage = turn(first, "alice", follow_up)
    assert usage.cached_tokens == len(history) - 1  # all but the unanswered last token
    assert_reference_greedy(model, follow_up, out)
    first.stop()  # persists on the way out; a new server reads it back
    second = engine(model, tiny_tokenizer, tmp_path)
    history = [*follow_up, *out]
    last = [*history, 10, 11]
    out, usage = turn(second, "alice", last)
    assert usage.cached_tokens == len(history) - 1
    assert_reference_greedy(model, last, out)
    second.stop()


@pytest.mark.parametrize("matched", [WINDOW - 2, 4 * WINDOW])
def test_a_prefix_hit_ending_inside_or_beyond_the_window_gives_the_reference_tokens(
    model: Model, tiny_tokenizer: Tokenizer, tmp_path: Path, matched: int
):
    """Another agent shares the first `matched` tokens: it reuses their blocks (the last one
    partial: a tail copied on write) and computes the rest, whose sliding layers read partly
    cached keys (a match shorter than the window) or none of them (a match far longer)."""
    server = engine(model, tiny_tokenizer, tmp_path)
    shared = model.prompt(matched, 2)
    turn(server, "first", [*shared, *model.prompt(20, 3)])
    prompt = [*shared, *model.prompt(20, 4)]
    out, usage = turn(server, "second", prompt)
    assert usage.cached_tokens == matched
    assert_reference_greedy(model, prompt, out)
    server.stop()


def held_pages(server: Engine, num_tokens: int) -> int:
    """Pages a history of `num_tokens` tokens needs: every block in a full-attention layer
    group, the blocks its window still reads in a sliding one."""
    spec = server.runner.cache_spec
    blocks = -(-num_tokens // spec.block_tokens)
    return sum(
        blocks - first_read_block(group.window, num_tokens, spec.block_tokens)
        for group in spec.groups
    )


def test_a_long_history_holds_the_windowed_kv_in_memory_and_on_disk_and_reads_back(
    model: Model, tiny_tokenizer: Tokenizer, tmp_path: Path
):
    """A history of many windows keeps, in the pool and then on disk, every block of the
    full-attention layers and only a window's of the sliding ones; evicted, then after a
    restart, its continuation still gives transformers' tokens."""
    server = engine(model, tiny_tokenizer, tmp_path)
    prompt = model.prompt(8 * WINDOW + 3, 5)
    answer, _ = turn(server, "alice", prompt)
    history = [*prompt, *answer]
    spec = server.runner.cache_spec
    needed = held_pages(server, len(history) - 1)
    full_attention = len(spec.groups) * -(-(len(history) - 1) // BLOCK_TOKENS)
    assert needed < 0.6 * full_attention
    memory = server.agents.describe(server.agents.by_key[AgentKey("alice")])
    assert memory is not None and memory["bytes_in_memory"] == needed * spec.bytes_per_page
    assert server.agents.persist([AgentKey("alice")], timeout=30).failed == 0
    assert server.tiering.disk.stats.files == needed
    assert server.agents.evict([AgentKey("alice")]) == needed
    follow_up = [*history, 7, 8]
    out, usage = turn(server, "alice", follow_up)
    assert usage.cached_tokens == len(history) - 1
    assert_reference_greedy(model, follow_up, out)
    server.stop()
    restarted = engine(model, tiny_tokenizer, tmp_path)
    history = [*follow_up, *out]
    last = [*history, 9]
    out, usage = turn(restarted, "alice", last)
    assert usage.cached_tokens == len(history) - 1
    assert_reference_greedy(model, last, out)
    restarted.stop()


def test_a_prefix_whose_sliding_pages_were_dropped_recomputes_and_gives_the_reference(
    model: Model, tiny_tokenizer: Tokenizer, tmp_path: Path
):
    """The pages a sliding window left are cached as the first to go and never written: once
    memory pressure took them, a prompt sharing the start of a history cannot reuse it (a
    sliding layer's K/V cannot be recomputed alone) and computes it, rightly."""
    server = engine(model, tiny_tokenizer, tmp_path)
    history = model.prompt(8 * WINDOW, 6)
    turn(server, "alice", history)
    pool = server.pool
    dropped = sum(pool.tier_of(p) == TIER_OUT_OF_WINDOW for p in pool.cached_blocks())
    assert dropped > 0
    pool.release(pool.allocate(pool.num_free + dropped))  # pressure: they are reclaimed
    server.tiering.writer.flush(30)
    alice = server.agents.by_key[AgentKey("alice")]
    # on disk: the pages her next turn reads, written behind her turn; none her window left
    assert server.tiering.disk.stats.files == held_pages(server, alice.num_tokens)
    prompt = [*history[: 4 * WINDOW], 1, 2, 3]
    out, usage = turn(server, "bob", prompt)
    assert usage.cached_tokens == 0  # every window before alice's last lost its pages
    assert_reference_greedy(model, prompt, out)
    server.stop()
