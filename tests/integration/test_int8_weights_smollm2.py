"""8-bit weights on the real SmolLM2: int8 greedy decoding follows bf16's on chat prompts, for
the share of tokens and the run lengths measured (benchmarks/quant_accuracy.py gives the full
table), and the weights take about half the bytes."""

from __future__ import annotations

import statistics

import pytest

from semantic.backends.torch.runner import TorchRunner
from semantic.core import Batch, BatchItem, SamplingParams
from semantic.models.checkpoint import Checkpoint

pytestmark = pytest.mark.integration

QUESTIONS = [
    "Write a short poem about the sea.",
    "Explain what a hash table is.",
    "Tell me a story about a dragon.",
    "Describe how a bicycle works.",
    "Give me some tips for learning to cook.",
]
TOKENS = 32
GREEDY = SamplingParams(temperature=0.0)


def make_runner(checkpoint: Checkpoint, weights: str) -> TorchRunner:
    return TorchRunner(
        checkpoint.config,
        checkpoint.weights(),
        block_tokens=16,
        cache_budget_mb=32,
        dtype="bfloat16",
        device="cpu",
        weight_format=weights,
    )


def next_tokens(runner: TorchRunner, ids: list[int], answer: list[int] | None) -> list[int]:
    """Greedy argmax after the prompt and after each token that follows it: `answer`'s tokens
    when given (teacher forcing), else the runner's own (TOKENS of them)."""
    table, out, fed = [list(range(8))], [], 0
    step = ids
    for i in range(TOKENS):
        item = BatchItem(0, step, fed, table, True, GREEDY, i)
        token = int(runner.forward_logits(Batch([item]))[0].argmax())
        out.append(token)
        fed += len(step)
        step = [answer[i] if answer is not None else token]
    return out


def agreed_run(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), len(a))


def test_int8_greedy_follows_bf16_on_chat_prompts(checkpoint: Checkpoint) -> None:
    bf16, int8 = make_runner(checkpoint, "bf16"), make_runner(checkpoint, "int8")
    assert int8.model.lm_head.nbytes < bf16.model.lm_head.nbytes * 0.51
    top1, runs = [], []
    for question in QUESTIONS:
        text = checkpoint.chat_template.render([{"role": "user", "content": question}])
        ids = checkpoint.tokenizer.encode(text)
        answer = next_tokens(bf16, ids, None)
        forced = next_tokens(int8, ids, answer)
        top1 += [a == b for a, b in zip(answer, forced, strict=True)]
        runs.append(agreed_run(answer, next_tokens(int8, ids, None)))
    # measured (our kernels): 152 of 160 forced tokens; runs of 4, 18, 31, 4 and 6 tokens
    # (with a bf16 cache 4, 13, 23, 32 and 6; before the 8-bit cache's attention went integer,
    # 32, 13, 32, 32 and 6). Where a near tie parts two greedy answers is chance that any
    # change of rounding moves, so the runs are held to their first tokens only; the forced
    # share is the measure.
    assert statistics.fmean(top1) >= 0.9, top1
    assert min(runs) >= 3, runs
