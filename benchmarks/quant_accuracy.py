"""How far a configuration's numerics drift from the model's own on a real model: the logit
error and greedy agreement of, e.g., an 8-bit KV cache or 8-bit weights against bf16 weights
and a KV cache in the model's dtype.

    python benchmarks/quant_accuracy.py --setting kv_dtype=int8
    python benchmarks/quant_accuracy.py --setting weights=int8 --tokens 64 --model gemma3-270m
    python benchmarks/quant_accuracy.py --setting backend=mlx --setting weights=int4 --chat-only
    python benchmarks/quant_accuracy.py --setting weights=gguf --model qwen2.5-coder-1.5b

Both configurations are built from the server's own settings (`--setting name=value` is any
setting, as `serve` takes it), on the same weights and prompts: chat questions, and the
benchmark's prompts with long system prompts (the history a returning agent's KV holds). For
each prompt the model's own configuration decodes `--tokens` greedily; the variant then reads the
same tokens (teacher forcing), so every position compares logits over the same context:

    logit error     mean and max |variant - default| over the vocabulary, and the mean error
                    relative to the default logits' standard deviation
    top-1           the share of positions where the variant's argmax is the default's token
    free run        how many tokens the variant, decoding on its own, agrees before it diverges

Both run on the variant's backend (torch unless `--setting backend=mlx`) with its device;
nothing is downloaded. `--chat-only` leaves out the long prompts, for a slow backend (MLX's CPU
build on Linux).
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import dataclass
from typing import Any, Protocol, cast

import torch

from semantic.backends import create_runner, with_weights
from semantic.core import Batch, BatchItem, CacheSpec, SamplingParams
from semantic.models.checkpoint import Checkpoint, load_checkpoint
from semantic.models.registry import ModelRegistry
from semantic.settings.options import runner_options
from semantic.settings.settings import Settings
from semantic_bench.plan import sentences

GREEDY = SamplingParams(temperature=0.0)
CHUNK = 512
QUESTIONS = (
    "What is the capital of France, and why did it become the capital?",
    "Write a Python function that returns the n-th Fibonacci number iteratively.",
    "Explain in three sentences how a hash table handles collisions.",
    "List five tips for writing clear commit messages.",
    "Summarize the plot of a heist story in which nothing goes as planned.",
    "Translate 'the weather is nice today' into Spanish and German.",
)
LONG_SYSTEM_WORDS = (700, 1500)  # ~1K and ~2K tokens of history before the question


@dataclass(slots=True)
class PromptResult:
    name: str
    prompt_tokens: int
    mean_error: float
    max_error: float
    relative_error: float
    top1: float
    free_run: int


class Sequence:
    """One prompt's sequence in a runner's pool: every page its own, from page 0 up (the pool is
    sized for the longest prompt), one page range per layer group."""

    def __init__(self, runner: Runner, pages_per_group: int) -> None:
        self.runner = runner
        groups = len(runner.cache_spec.groups)
        self.tables = [
            list(range(g * pages_per_group, (g + 1) * pages_per_group)) for g in range(groups)
        ]
        self.length = 0

    def feed(self, ids: list[int]) -> torch.Tensor:
        """Compute `ids` after what was fed before (in chunks); the logits after the last one."""
        logits = torch.empty(0)
        for start in range(0, len(ids), CHUNK):
            chunk = ids[start : start + CHUNK]
            last = start + CHUNK >= len(ids)
            item = BatchItem(0, chunk, self.length, self.tables, last, GREEDY, 0)
            if last:
                logits = torch.as_tensor(self.runner.forward_logits(Batch([item])))[0]
            else:
                self.runner.run(Batch([item]))
            self.length += len(chunk)
        return logits


class Runner(Protocol):
    """What this script asks of a backend's runner (both have it)."""

    cache_spec: CacheSpec

    def run(self, batch: Batch) -> list[int | None]: ...

    def forward_logits(self, batch: Batch) -> Any: ...


# What the variant is measured against: the weights and the KV cache in the model's dtype (a
# GGUF's dequantized), on the variant's backend and device.
OWN_NUMERICS = {"kv_dtype": "model", "weights": "bf16"}


def build_runner(checkpoint: Checkpoint, overrides: dict[str, str], pool_mb: int) -> Runner:
    settings = Settings(**overrides, cache_budget_mb=pool_mb, prepared_weights=False)  # type: ignore[arg-type]
    # Either backend's runner has forward_logits, beside the ModelRunner port create_runner names.
    options, weights = with_weights(runner_options(settings), checkpoint)
    runner = create_runner(options, checkpoint.config, weights)
    return cast(Runner, runner)


def prompts(checkpoint: Checkpoint, chat_only: bool) -> list[tuple[str, list[int]]]:
    out = []
    for index, question in enumerate(QUESTIONS):
        out.append((f"chat {index + 1}", [{"role": "user", "content": question}]))
    for words in () if chat_only else LONG_SYSTEM_WORDS:
        system = "You are a careful assistant. " + sentences(f"accuracy-{words}", words)
        question = "Which subjects appear most often above? Answer briefly."
        out.append(
            (
                f"system ~{words} words",
                [{"role": "system", "content": system}, {"role": "user", "content": question}],
            )
        )
    tokenizer, template = checkpoint.tokenizer, checkpoint.chat_template
    return [(name, tokenizer.encode(template.render(messages))) for name, messages in out]


def greedy(
    runner: Runner, ids: list[int], tokens: int, pages: int
) -> tuple[list[int], list[torch.Tensor]]:
    sequence = Sequence(runner, pages)
    logits = sequence.feed(ids)
    out, seen = [], []
    for _ in range(tokens):
        seen.append(logits)
        out.append(int(logits.argmax()))
        logits = sequence.feed([out[-1]])
    return out, seen


def forced(runner: Runner, ids: list[int], answer: list[int], pages: int) -> list[torch.Tensor]:
    sequence = Sequence(runner, pages)
    seen = [sequence.feed(ids)]
    seen.extend(sequence.feed([token]) for token in answer[:-1])
    return seen


def compare(
    name: str, ids: list[int], base: Runner, variant: Runner, tokens: int, pages: int
) -> PromptResult:
    answer, base_logits = greedy(base, ids, tokens, pages)
    variant_logits = forced(variant, ids, answer, pages)
    errors = [(v - b).abs() for b, v in zip(base_logits, variant_logits, strict=True)]
    spread = statistics.fmean(float(b.std()) for b in base_logits)
    mean_error = statistics.fmean(float(e.mean()) for e in errors)
    agree = [int(v.argmax()) == t for v, t in zip(variant_logits, answer, strict=True)]
    free, _ = greedy(variant, ids, tokens, pages)
    run = next((i for i, (a, b) in enumerate(zip(answer, free, strict=True)) if a != b), tokens)
    return PromptResult(
        name,
        len(ids),
        mean_error,
        max(float(e.max()) for e in errors),
        mean_error / spread,
        statistics.fmean(agree),
        run,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--setting",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="the variant's settings",
    )
    parser.add_argument("--model", default="smollm2-135m", help="a built-in alias or a local path")
    parser.add_argument("--tokens", type=int, default=64, help="greedy tokens per prompt")
    parser.add_argument("--chat-only", action="store_true", help="no long system prompts")
    args = parser.parse_args()
    overrides = dict(setting.split("=", 1) for setting in args.setting)
    checkpoint = load_checkpoint(ModelRegistry().resolve(args.model).path, progress=False)
    cases = prompts(checkpoint, args.chat_only)
    block_tokens = Settings().block_tokens
    pages = -(-(max(len(ids) for _, ids in cases) + args.tokens) // block_tokens) + 1
    own = OWN_NUMERICS | {k: v for k, v in overrides.items() if k in ("backend", "device")}
    base = build_runner(checkpoint, own, _pool_mb(checkpoint, pages, block_tokens))
    variant = build_runner(checkpoint, own | overrides, _pool_mb(checkpoint, pages, block_tokens))
    results = [compare(name, ids, base, variant, args.tokens, pages) for name, ids in cases]
    report(results, overrides, args)


def _pool_mb(checkpoint: Checkpoint, pages: int, block_tokens: int) -> int:
    """Enough for `pages` pages per layer group in fp32 (any smaller KV dtype fits more)."""
    config = checkpoint.config
    per_layer_page = 2 * block_tokens * config.num_key_value_heads * config.head_dim * 4
    return -(-pages * per_layer_page * config.num_hidden_layers // 2**20) + 1


def report(
    results: list[PromptResult], overrides: dict[str, str], args: argparse.Namespace
) -> None:
    variant = " ".join(f"{k}={v}" for k, v in overrides.items()) or "(the default)"
    print(f"{args.model}: {variant} against the default, {args.tokens} greedy tokens per prompt\n")
    print("| prompt | tokens | mean logit error | max | mean / std | top-1 | free run |")
    print("|---|---|---|---|---|---|---|")
    for r in results:
        print(
            f"| {r.name} | {r.prompt_tokens} | {r.mean_error:.4f} | {r.max_error:.3f} | "
            f"{r.relative_error:.2%} | {r.top1:.1%} | {r.free_run} |"
        )
    print(
        f"| **all** | | {statistics.fmean(r.mean_error for r in results):.4f} | "
        f"{max(r.max_error for r in results):.3f} | "
        f"{statistics.fmean(r.relative_error for r in results):.2%} | "
        f"{statistics.fmean(r.top1 for r in results):.1%} | "
        f"median {statistics.median(r.free_run for r in results)} |"
    )


if __name__ == "__main__":
    main()
