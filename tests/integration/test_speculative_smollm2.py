"""Speculative decoding on the real SmolLM2 weights: drafts from the context change no greedy
token, under a repetition penalty too, and a model asked to copy its context accepts many."""

from __future__ import annotations

from pathlib import Path

import pytest

from semantic.backends.torch.runner import TorchRunner
from semantic.core import Request, SamplingParams, TokenEvent
from semantic.engine.engine import Engine
from semantic.engine.wiring import build_engine
from semantic.models.checkpoint import Checkpoint
from semantic.settings.options import engine_options
from semantic.settings.settings import Settings
from tests.integration.conftest import served_smollm2

pytestmark = pytest.mark.integration

CODE = """def mean(values):
    total = 0
    for value in values:
        total += value
    return total / len(values)


def variance(values):
    average = mean(values)
    total = 0
    for value in values:
        total += (value - average) ** 2
    return total / len(values)
"""
ASKS = [
    "Rename the function `mean` to `average_of` and return the whole file:\n\n" + CODE,
    "Repeat this code exactly:\n\n" + CODE,
]


def engine_for(checkpoint: Checkpoint, cache_dir: Path, draft: int) -> Engine:
    runner = TorchRunner(
        checkpoint.config,
        checkpoint.weights(),
        block_tokens=16,
        cache_budget_mb=64,
        dtype="float32",
        device="cpu",
    )
    served = served_smollm2(checkpoint)
    settings = Settings(
        max_batch_tokens=256, batch_window_ms=0, cache_dir=cache_dir, speculative_tokens=draft
    )
    return build_engine(runner, served, engine_options(settings))


def generate(engine: Engine, checkpoint: Checkpoint, **sampling: object) -> list[list[int]]:
    """Each ask alone, then both together; each one's output token ids."""
    params = SamplingParams(**{"temperature": 0.0, "max_tokens": 80, **sampling})  # type: ignore[arg-type]
    prompts = [
        checkpoint.tokenizer.encode(
            checkpoint.chat_template.render([{"role": "user", "content": ask}])
        )
        for ask in ASKS
    ]
    outputs: list[list[int]] = []
    for group in ([0], [1], [0, 1]):
        events: dict[int, list[TokenEvent]] = {i: [] for i in group}
        for i in group:
            engine.submit(Request(f"q{i}-{len(outputs)}", prompts[i], params), events[i].append)
        engine.run_until_idle()
        engine.pool.check_integrity()
        outputs += [[t for e in events[i] for t in e.token_ids] for i in group]
    return outputs


def test_greedy_tokens_are_the_same_with_drafts_and_many_are_accepted(
    checkpoint: Checkpoint, tmp_path: Path
) -> None:
    plain = generate(engine_for(checkpoint, tmp_path / "plain", 0), checkpoint)
    engine = engine_for(checkpoint, tmp_path / "drafts", 8)
    assert generate(engine, checkpoint) == plain
    drafted = engine.metrics.draft_tokens._value.get()
    accepted = engine.metrics.draft_accepted_tokens._value.get()
    assert accepted > 0.3 * drafted > 0, (accepted, drafted)


def test_sampled_rows_verify_drafts_and_finish(checkpoint: Checkpoint, tmp_path: Path) -> None:
    engine = engine_for(checkpoint, tmp_path, 8)
    outputs = generate(engine, checkpoint, temperature=0.7, top_p=0.95, seed=3)
    assert all(outputs)
    assert engine.metrics.draft_tokens._value.get() > 0


def test_greedy_tokens_under_a_repetition_penalty_are_the_same_with_drafts(
    checkpoint: Checkpoint, tmp_path: Path
) -> None:
    """Each draft position is verified under the penalty its own context gives (the draft
    tokens before it seen): drafts accepted and rejected, the tokens those of no drafts. (At
    1.3 this model repeats no 3-token span of its context, so nothing drafts: the unit tests
    of the verifier take 1.3.)"""
    penalty = 1.1
    plain = generate(
        engine_for(checkpoint, tmp_path / "plain", 0), checkpoint, repetition_penalty=penalty
    )
    engine = engine_for(checkpoint, tmp_path / "drafts", 8)
    assert generate(engine, checkpoint, repetition_penalty=penalty) == plain
    drafted = engine.metrics.draft_tokens._value.get()
    accepted = engine.metrics.draft_accepted_tokens._value.get()
    assert 0 < accepted < drafted, (accepted, drafted)
