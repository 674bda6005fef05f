"""The agent cache with real model code: tiny random-weight models of the families with
sliding windows, through the engine (full attention has the SmolLM2 engine tests). A
continuation after the cache went to disk and came back (evicted; a restart) gives
transformers' greedy tokens, and so do prefix hits whose matched length ends inside a sliding
window and beyond it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from semantic.config import Settings
from semantic.core import AgentKey, Request, SamplingParams, TokenEvent, Usage
from semantic.engine.engine import Engine
from semantic.models.served import ServedModel
from semantic.options import engine_options
from semantic.text.chat import CHATML_TEMPLATE, ChatTemplate
from semantic.text.tokenizer import Tokenizer
from tests.integration.reference_models import BLOCK_TOKENS, Model
from tests.integration.test_families_vs_transformers import FAMILIES, VOCAB, WINDOW

pytestmark = pytest.mark.integration

CACHED_FAMILIES = ["gemma3", "gpt_oss", "mistral_sliding"]
STEPS = 32


@pytest.fixture(scope="module", params=CACHED_FAMILIES)
def model(request: pytest.FixtureRequest) -> Model:
    build: Callable[[], torch.nn.Module] = FAMILIES[request.param]
    torch.manual_seed(0)
    return Model("cpu", build(), vocab=VOCAB)


def engine(model: Model, tiny_tokenizer: Tokenizer, cache_dir: Path) -> Engine:
    template = ChatTemplate(CHATML_TEMPLATE, bos_token=None, eos_token=None)
    served = ServedModel("tiny", model.config, tiny_tokenizer, template, 512, "random-weights")
    settings = Settings(max_batch_tokens=24, batch_window_ms=0, cache_dir=cache_dir)
    return Engine(model.make_runner("float32"), served, engine_options(settings))


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
