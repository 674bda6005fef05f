"""How closely one runner follows another on chat prompts: the reference decodes greedily, the
other is fed the reference's tokens (teacher forcing), and each step's logits are compared. The
GGUF weight-format tests share it."""

from __future__ import annotations

import torch

from semantic.backends.torch.runner import TorchRunner
from semantic.core import Batch, BatchItem, SamplingParams
from semantic.models.checkpoint import Checkpoint

TOKENS = 12
GREEDY = SamplingParams(temperature=0.0)


def logits_along(
    runner: TorchRunner, ids: list[int], answer: list[int] | None
) -> tuple[list[int], list[torch.Tensor]]:
    """The greedy tokens and the logits after the prompt and after each token that follows it:
    `answer`'s tokens when given (teacher forcing), else the runner's own (TOKENS of them)."""
    table, fed, step, tokens, logits = [list(range(16))], 0, ids, [], []
    for i in range(TOKENS):
        item = BatchItem(0, step, fed, table, True, GREEDY, i)
        logits.append(runner.forward_logits(Batch([item]))[0].float())
        tokens.append(int(logits[-1].argmax()))
        fed += len(step)
        step = [answer[i] if answer is not None else tokens[-1]]
    return tokens, logits


def agreement(
    checkpoint: Checkpoint, reference: TorchRunner, other: TorchRunner, questions: list[str]
) -> tuple[list[bool], list[float]]:
    """Over `questions`: whether `other`'s top token is the reference's, at each step, and its
    logits' mean error as a share of the reference's spread."""
    top1: list[bool] = []
    errors: list[float] = []
    for question in questions:
        text = checkpoint.chat_template.render([{"role": "user", "content": question}])
        ids = checkpoint.tokenizer.encode(text)
        answer, base = logits_along(reference, ids, None)
        forced, ours = logits_along(other, ids, answer)
        errors += [float((o - b).abs().mean() / b.std()) for b, o in zip(base, ours, strict=True)]
        top1 += [a == f for a, f in zip(answer, forced, strict=True)]
    return top1, errors
