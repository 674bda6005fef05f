"""The engine over the MLX backend on the real SmolLM2 weights: the greedy tokens of transformers,
and batching that changes nothing. MLX's CPU build computes slowly, so the prompts are short."""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest

from semantic.engine.engine import Engine
from semantic.models.checkpoint import Checkpoint
from tests.integration.test_engine_smollm2 import (
    QUESTIONS,
    engine_over,
    generate,
    prompt_ids,
    reference_greedy,
)

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        importlib.util.find_spec("mlx") is None,
        reason="needs MLX (Apple Silicon, or `pip install 'mlx[cpu]'` on Linux)",
    ),
]


@pytest.fixture(scope="module")
def mlx_engine(checkpoint: Checkpoint, tmp_path_factory: pytest.TempPathFactory) -> Engine:
    from semantic.backends.mlx.runner import MLXRunner

    # fp32 (on a Mac too, where "auto" is bf16): exact greedy parity with transformers
    runner = MLXRunner(
        checkpoint.config,
        checkpoint.weights(),
        block_tokens=16,
        cache_budget_mb=32,
        dtype="float32",
    )
    return engine_over(runner, checkpoint, tmp_path_factory.mktemp("mlx"))


def test_greedy_tokens_equal_transformers(
    checkpoint: Checkpoint, reference: Any, mlx_engine: Engine
) -> None:
    for question in QUESTIONS[:2]:
        ids = prompt_ids(checkpoint, question)
        [ours] = generate(mlx_engine, [ids], max_tokens=16, ignore_eos=False)
        assert len(ours) >= 8 and ours == reference_greedy(reference, ids, 16), question


def test_four_requests_together_give_the_tokens_they_give_alone(
    checkpoint: Checkpoint, mlx_engine: Engine
) -> None:
    prompts = [prompt_ids(checkpoint, question) for question in QUESTIONS[2:6]]
    assert len({len(p) for p in prompts}) > 1, "the prompts should differ in length"
    alone = [generate(mlx_engine, [p], max_tokens=8)[0] for p in prompts]
    assert generate(mlx_engine, prompts, max_tokens=8) == alone
