"""What a draft model could give speculative decoding here, measured before building one: how
often a small model's greedy token is a larger one's along the larger one's own greedy answers,
and each one's decode step, on the torch backend as `semantic serve` loads them.

    python benchmarks/draft_agreement.py [--target qwen2.5-coder-1.5b] [--draft qwen2.5-coder-0.5b]
        [--tokens 200]

A draft of k tokens accepted at rate a gives (1 - a^(k+1)) / (1 - a) tokens a cycle, for k
steps of the draft model and one verification of k + 1 rows: the figures printed are what that
formula needs (docs/benchmark-history.md has the arithmetic).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from semantic.backends import create_runner, with_weights
from semantic.backends.torch.runner import TorchRunner
from semantic.core import Batch, BatchItem, SamplingParams
from semantic.models.checkpoint import Checkpoint, load_checkpoint
from semantic.models.registry import ModelRegistry
from semantic.settings.options import runner_options
from semantic.settings.settings import Settings

GREEDY = SamplingParams(temperature=0.0)
ASKS = [
    "Write a Python function that parses an ISO 8601 date string without using datetime, "
    "with tests.",
    "Explain how a B-tree keeps itself balanced when keys are inserted.",
    "Write a bash script that finds the ten largest files under a directory and prints their "
    "sizes.",
]
PAGES = 8  # of 256 tokens a sequence: room for a prompt and its answer


def load(model: str) -> tuple[TorchRunner, Checkpoint]:
    checkpoint = load_checkpoint(ModelRegistry().resolve(model).path, progress=False)
    options, tensors = with_weights(runner_options(Settings(cache_budget_mb=256)), checkpoint)
    runner = create_runner(options, checkpoint.config, tensors)
    assert isinstance(runner, TorchRunner)
    return runner, checkpoint


def step(runner: TorchRunner, item: BatchItem) -> int:
    """The token `runner` gives `item` (greedy, no draft: one id)."""
    [token] = runner.run(Batch([item]))
    assert isinstance(token, int)
    return token


def greedy(
    runner: TorchRunner, seq: int, prompt: list[int], tokens: int
) -> tuple[list[int], float]:
    """`tokens` greedy tokens after `prompt`, and the median decode step's seconds."""
    table = list(range(seq * PAGES, (seq + 1) * PAGES))
    output, steps = [step(runner, BatchItem(seq, prompt, 0, [table], True, GREEDY, 0))], []
    while len(output) < tokens:
        item = BatchItem(seq, [output[-1]], len(prompt) + len(output) - 1, [table], True, GREEDY, 0)
        started = time.perf_counter()
        output.append(step(runner, item))
        steps.append(time.perf_counter() - started)
    return output, statistics.median(steps)


def guesses(runner: TorchRunner, seq: int, prompt: list[int], answer: list[int]) -> list[int]:
    """`runner`'s greedy token at each position of `answer`, fed `answer` itself."""
    table = list(range(seq * PAGES, (seq + 1) * PAGES))
    found = [step(runner, BatchItem(seq, prompt, 0, [table], True, GREEDY, 0))]
    for n, given in enumerate(answer[:-1]):
        found.append(
            step(runner, BatchItem(seq, [given], len(prompt) + n, [table], True, GREEDY, 0))
        )
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="qwen2.5-coder-1.5b")
    parser.add_argument("--draft", default="qwen2.5-coder-0.5b")
    parser.add_argument("--tokens", type=int, default=200)
    args = parser.parse_args()
    target, checkpoint = load(args.target)
    draft, _ = load(args.draft)
    agreed = total = 0
    for seq, ask in enumerate(ASKS):
        text = checkpoint.chat_template.render([{"role": "user", "content": ask}])
        prompt = checkpoint.tokenizer.encode(text)
        answer, target_step = greedy(target, seq, prompt, args.tokens)
        _, draft_step = greedy(draft, seq, prompt, 24)
        found = guesses(draft, seq + len(ASKS), prompt, answer)
        same = sum(a == b for a, b in zip(found, answer, strict=True))
        agreed, total = agreed + same, total + len(answer)
        print(
            f"{Path(__file__).stem} ask {seq}: the draft's token is the target's "
            f"{same}/{len(answer)} ({same / len(answer):.0%}); decode step "
            f"{target_step * 1e3:.1f} ms ({args.target}), {draft_step * 1e3:.1f} ms "
            f"({args.draft}: {draft_step / target_step:.2f} of it)",
            flush=True,
        )
    print(f"agreement over all: {agreed / total:.0%}")


if __name__ == "__main__":
    main()
