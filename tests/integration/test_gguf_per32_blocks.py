"""Real GGUFs whose matrices are mostly per-32 block types, computed on their own blocks by our
group kernel (`weights = "gguf"`): SmolLM2-135M's Q4_1 (K = 576 and 1536) and Qwen2.5-Coder-0.5B
Q4_K_M's Q5_0 and Q8_0 (K = 896, no multiple of 256). Each matrix is on the kernel in its
file's type, and the model follows the same file dequantized to bf16 on chat prompts, within
the error and at the agreement measured (benchmarks/quant_accuracy.py has the full table:
docs/benchmark-history.md). Skips without our kernels or without the file."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from semantic.backends.torch.blocks import FlatWeight, GroupLinear
from semantic.backends.torch.kernels import cpu_kernels, unavailable_reason
from semantic.backends.torch.runner import TorchRunner
from semantic.errors import ModelLoadFailed
from semantic.models.checkpoint import load_checkpoint
from semantic.models.registry import ModelRegistry
from tests.integration.forced_logits import agreement
from tests.integration.test_gguf_blocks_kernel import make_runner

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        cpu_kernels() is None, reason=f"needs our AVX-512 BF16/VNNI kernels: {unavailable_reason()}"
    ),
]

QUESTIONS = ["Write a Python function that reverses a string.", "What does `git rebase` do?"]
# measured with benchmarks/quant_accuracy.py (8 prompts on SmolLM2, 6 on the 0.5B, 16 tokens):
# SmolLM2 94.5% top-1, mean error 7.0% of the logits' spread (x's int8 quantization, as int8
# weights' 9.8%); the 0.5B 95.8% and 1.8%
TOP1_SMOLLM2, ERROR_SMOLLM2 = 0.85, 0.10
TOP1_05B, ERROR_05B = 0.9, 0.05


def planes(runner: TorchRunner) -> dict[str, set[int]]:
    """Each kind of linear's per-32 planes over the layers (4: Q4_x, 5: Q5_x, 8: Q8_0's form)."""
    found: dict[str, set[int]] = {}
    model = runner.model
    for block in model.blocks:
        pairs = [(name, getattr(block.attn, name)) for name in ("qkv", "o")]
        pairs += [(name, getattr(block.mlp, name)) for name in ("gate_up", "down")]
        for name, linear in pairs:
            if isinstance(linear, GroupLinear) and isinstance(linear.weight, FlatWeight):
                found.setdefault(name, set()).add(linear.weight.planes)
    head = model.lm_head
    if isinstance(head, GroupLinear) and isinstance(head.weight, FlatWeight):
        found["lm_head"] = {head.weight.planes}
    return found


def test_smollm2s_q4_1_blocks_on_our_kernel_follow_the_dequantized_file(
    smollm2_path: Path,
) -> None:
    checkpoint = load_checkpoint(smollm2_path, progress=False)
    assert not checkpoint.k_blocks
    blocks = make_runner(checkpoint, "gguf")
    # every projection in Q4_1 (the fused QKV and gate-up too), the tied head in Q8_0
    expected = {"qkv": {4}, "o": {4}, "gate_up": {4}, "down": {4}, "lm_head": {8}}
    assert planes(blocks) == expected
    top1, errors = agreement(checkpoint, make_runner(checkpoint, "bf16"), blocks, QUESTIONS)
    assert statistics.fmean(top1) >= TOP1_SMOLLM2, top1
    assert statistics.fmean(errors) < ERROR_SMOLLM2, errors


def test_the_05bs_q5_0_and_q8_0_blocks_on_our_kernel_follow_the_dequantized_file() -> None:
    try:
        path = ModelRegistry().resolve("qwen2.5-coder-0.5b").path
        checkpoint = load_checkpoint(path, progress=False)
    except ModelLoadFailed:
        pytest.skip("Qwen2.5-Coder-0.5B is not in the model cache")
    blocks = make_runner(checkpoint, "gguf")
    found = planes(blocks)
    # Q5_0 Q and K beside a Q8_0 V (half the layers; the others' V is Q5_0 too): fused in 8
    # bits, exactly; the rest in the file's types
    assert found["qkv"] == {5, 8} and found["o"] == {5} and found["gate_up"] == {5}
    assert found["lm_head"] == {8}
    top1, errors = agreement(checkpoint, make_runner(checkpoint, "bf16"), blocks, QUESTIONS)
    assert statistics.fmean(top1) >= TOP1_05B, top1
    assert statistics.fmean(errors) < ERROR_05B, errors
