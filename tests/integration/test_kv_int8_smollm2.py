"""An 8-bit KV cache on the real SmolLM2 weights answers as the bf16 cache does: greedy tokens
agree for as long as we measured them to, with margin, on our kernels and on the stock path."""

from __future__ import annotations

import pytest
import torch

from semantic.backends.torch.kernels import cpu_kernels
from semantic.backends.torch.runner import TorchRunner
from semantic.core import Batch, BatchItem, SamplingParams
from semantic.models.checkpoint import Checkpoint

pytestmark = pytest.mark.integration

GREEDY = SamplingParams(temperature=0.0)
PROMPT = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
# Measured on our kernels: the int8 cache's greedy answer to this prompt equals the bf16
# cache's for all 64 tokens asked; other prompts part at a near-tie after 1-30 tokens
# (docs/benchmark-history.md), so the test holds this one, to half of what was measured.
AGREED_TOKENS = 32


def greedy_answer(
    checkpoint: Checkpoint, kv_dtype: str, kernels: bool, prompt: list[int], steps: int
) -> tuple[list[int], torch.Tensor]:
    """The greedy tokens after `prompt` and the logits [steps, V] that chose them."""
    runner = TorchRunner(
        checkpoint.config,
        checkpoint.weights(),
        block_tokens=16,
        cache_budget_mb=32,
        kv_dtype=kv_dtype,
        kernels=kernels,
    )
    table, ids, logits = list(range(16)), list(prompt), []
    for step in range(steps):
        start = len(ids) - 1 if step else 0  # the prompt, then one token at a time
        item = BatchItem(0, ids[start:], start, [table], True, GREEDY, step)
        logits.append(runner.forward_logits(Batch([item]))[0])
        ids.append(int(logits[-1].argmax()))
    return ids[len(prompt) :], torch.stack(logits)


@pytest.mark.parametrize("kernels", [True, False])
def test_an_int8_cache_answers_as_the_bf16_cache_greedily(checkpoint: Checkpoint, kernels: bool):
    if kernels and cpu_kernels() is None:
        pytest.skip("needs our CPU kernels")
    prompt = checkpoint.tokenizer.encode(PROMPT)
    full, full_logits = greedy_answer(checkpoint, "model", kernels, prompt, AGREED_TOKENS)
    int8, int8_logits = greedy_answer(checkpoint, "int8", kernels, prompt, AGREED_TOKENS)
    assert int8 == full
    # the same context throughout: the logits differ by what the cache's rounding moves
    assert float((int8_logits - full_logits).abs().max()) < 3.0
