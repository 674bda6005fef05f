"""Single-stream speed and memory of a model's weight formats on the torch backend: prefill and
decode tokens/s, the linears' bytes and the process's memory, each format loaded in a process of
its own (so its memory is its own), the formats taking turns run after run.

    python benchmarks/weights_speed.py --model qwen2.5-coder-1.5b --weights bf16,gguf
    python benchmarks/weights_speed.py --model qwen2.5-coder-0.5b --chunks 64,128,512 --runs 5
    python benchmarks/weights_speed.py --model qwen2.5-coder-0.5b --together --threads 1

A run prefills a prompt of `--prompt` tokens in chunks of each of `--chunks` tokens (the
server's `max_batch_tokens` is 512; a returning agent's turn is a chunk of its new tokens), then
decodes `--decode` tokens greedily after it: `decode` is the median step's rate, `decode_best`
the fastest step's (what an idle machine comes near). Figures are medians over `--runs` runs; on
a shared machine, read them with the load average printed beside them.

The memory wall beside them: `step_mib`, the weights a decode step reads (every layer's linears
and the LM head; the embedding table's rows aside), `read_gbs`, the rate this process reads a
1 GiB tensor at (`torch.sum`, median of 5, measured in each run), and `wall`, the decode rate
that reading alone would allow. `--linear-rows 1,4,16` adds `linears_<rows>`: ms to run every
linear of a step once on that many rows (median of 5).

The matrix units' rate beside them: `matmul_gflops`, what a plain torch bf16 matrix product
(oneDNN: AMX tiles where the CPU has them) reaches on one layer's linear shapes at the largest
chunk's rows, and `prefill_share`, the largest chunk's prefill in useful GFLOP/s (every layer's
linears, 2 · N · K a token, and its causal attention, 4 · heads · head_dim a key seen) as a
share of it: above 1 where 8-bit arithmetic outruns bf16.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

import torch

from semantic.backends import create_runner, with_weights
from semantic.backends.torch.linear import Linear
from semantic.backends.torch.runner import TorchRunner
from semantic.core import Batch, BatchItem, SamplingParams
from semantic.engine.runner import StepToken
from semantic.models.checkpoint import load_checkpoint
from semantic.models.registry import ModelRegistry
from semantic.settings.options import runner_options
from semantic.settings.settings import Settings
from semantic_bench.machine import memory_read_gbs

GREEDY = SamplingParams(temperature=0.0)
BLOCK_TOKENS = 256


def measure(args: argparse.Namespace, weights: str, chunks: list[int]) -> dict[str, Any]:
    """One process's figures for one format: load, then one run of every chunk size."""
    started = time.perf_counter()
    runner, resolved = load(args, weights)
    figures: dict[str, Any] = {
        "weights": resolved,
        "load_s": time.perf_counter() - started,
        "linear_mib": _linear_bytes(runner) / 2**20,
        **_memory_mib(),
    }
    return figures | timed(runner, args, chunks)


def load(args: argparse.Namespace, weights: str) -> tuple[TorchRunner, str]:
    """A runner of `weights` ("auto" resolved: the second item)."""
    checkpoint = load_checkpoint(ModelRegistry().resolve(args.model).path, progress=False)
    settings = Settings(
        weights=weights,
        cache_budget_mb=args.cache_mb,
        prepared_weights=False,
        threads=args.threads,
    )
    options, tensors = with_weights(runner_options(settings), checkpoint)
    runner = create_runner(options, checkpoint.config, tensors)
    assert isinstance(runner, TorchRunner)
    return runner, options.weights


def timed(runner: TorchRunner, args: argparse.Namespace, chunks: list[int]) -> dict[str, Any]:
    """One run of every chunk size: prefill and decode rates, and the load beside them."""
    ids = list(range(1000, 1000 + args.prompt))
    figures: dict[str, Any] = {}
    for chunk in chunks:
        prefill_s, steps_s = _one_run(runner, ids, chunk, args.decode)
        figures[f"prefill_{chunk}"] = args.prompt / prefill_s
        figures["decode"] = 1 / statistics.median(steps_s)
        figures["decode_best"] = 1 / min(steps_s)
    matmul = _matmul_gflops(runner, max(chunks))
    prefill = _prefill_gflops(runner, args.prompt, figures[f"prefill_{max(chunks)}"])
    figures |= {"matmul_gflops": matmul, "prefill_share": prefill / matmul}
    step_bytes = _step_bytes(runner)
    read_gbs = memory_read_gbs()
    figures |= {"step_mib": step_bytes / 2**20, "read_gbs": read_gbs}
    figures["wall"] = read_gbs * 1e9 / step_bytes
    for rows in args.linear_rows:
        figures[f"linears_{rows}"] = _linears_ms(runner, rows)
    figures["load"] = os.getloadavg()[0]
    return figures


def _step_bytes(runner: TorchRunner) -> int:
    """The weights one decode step reads: every layer's linears and the LM head."""
    return sum(linear.nbytes for linear in _step_linears(runner))


def _step_linears(runner: TorchRunner) -> list[Linear]:
    model = runner.model
    linears: list[Linear] = [model.lm_head]
    for block in model.blocks:
        linears += [block.attn.qkv, block.attn.o, block.mlp.gate_up, block.mlp.down]  # type: ignore[attr-defined]
    return linears


def _layer_shapes(runner: TorchRunner) -> list[tuple[int, int]]:
    """(out, in) features of one layer's linears."""
    block = runner.model.blocks[0]
    linears = [block.attn.qkv, block.attn.o, block.mlp.gate_up, block.mlp.down]  # type: ignore[attr-defined]
    shapes = []
    with torch.inference_mode():
        for linear in linears:
            width = _in_features(runner, linear)
            shapes.append((linear(torch.zeros(1, width, dtype=runner.dtype)).shape[-1], width))
    return shapes


def _matmul_gflops(runner: TorchRunner, rows: int) -> float:
    """GFLOP/s of torch's bf16 matrix product on one layer's linear shapes, `rows` rows, median
    of 5: what the machine's matrix units give a plain program."""
    pairs = [
        (torch.randn(rows, k, dtype=torch.bfloat16), torch.randn(n, k, dtype=torch.bfloat16).t())
        for n, k in _layer_shapes(runner)
    ]
    flops = sum(2 * rows * w.shape[0] * w.shape[1] for _, w in pairs)
    seconds = []
    with torch.inference_mode():
        for _ in range(6):
            started = time.perf_counter()
            for x, w in pairs:
                torch.matmul(x, w)
            seconds.append(time.perf_counter() - started)
    return flops / statistics.median(seconds[1:]) / 1e9


def _prefill_gflops(runner: TorchRunner, prompt: int, rate: float) -> float:
    """The useful GFLOP/s of a prefill at `rate` tokens/s: each layer's linears, and causal
    attention over half the prompt's keys on average (the LM head runs on one row only)."""
    config, layers = runner.model.config, len(runner.model.blocks)
    linears = sum(2 * n * k for n, k in _layer_shapes(runner)) * layers
    attention = 4 * config.num_attention_heads * config.head_dim * prompt / 2 * layers
    return rate * (linears + attention) / 1e9


def _linears_ms(runner: TorchRunner, rows: int) -> float:
    """ms to run every linear of a decode step once on `rows` rows, median of 5."""
    inputs: dict[int, torch.Tensor] = {}
    calls = []
    for linear in _step_linears(runner):
        width = _in_features(runner, linear)
        inputs.setdefault(width, torch.randn(rows, width, dtype=runner.dtype))
        calls.append((linear, inputs[width]))
    seconds = []
    with torch.inference_mode():
        for _ in range(6):
            started = time.perf_counter()
            for linear, x in calls:
                linear(x)
            seconds.append(time.perf_counter() - started)
    return 1000 * statistics.median(seconds[1:])


def _in_features(runner: TorchRunner, linear: Linear) -> int:
    """A step's linear's input width: the hidden size but for the attention output (heads ·
    head_dim) and the down projection (the MLP's inner width)."""
    config = runner.model.config
    for block in runner.model.blocks:
        if linear is block.attn.o:
            return config.num_attention_heads * config.head_dim
        if linear is block.mlp.down:  # type: ignore[attr-defined]
            return config.intermediate_size
    return config.hidden_size


def _one_run(
    runner: TorchRunner, ids: list[int], chunk: int, decode: int
) -> tuple[float, list[float]]:
    """The prefill's seconds, and each decode step's."""
    table = list(range(-(-(len(ids) + decode + 1) // BLOCK_TOKENS)))
    started, length = time.perf_counter(), 0
    token: StepToken = None
    for start in range(0, len(ids), chunk):
        part = ids[start : start + chunk]
        last = start + chunk >= len(ids)
        (token,) = runner.run(Batch([BatchItem(0, part, length, [table], last, GREEDY, 0)]))
        length += len(part)
    prefill_s = time.perf_counter() - started
    steps = []
    for _ in range(decode):
        assert isinstance(token, int)
        started = time.perf_counter()
        (token,) = runner.run(Batch([BatchItem(0, [token], length, [table], True, GREEDY, 0)]))
        steps.append(time.perf_counter() - started)
        length += 1
    return prefill_s, steps


def _linear_bytes(runner: TorchRunner) -> int:
    """Every linear's weights (embedding table and LM head counted once where tied)."""
    model = runner.model
    linears = {id(model.embed): model.embed, id(model.lm_head): model.lm_head}
    for block in model.blocks:
        for linear in (block.attn.qkv, block.attn.o, block.mlp.gate_up, block.mlp.down):  # type: ignore[attr-defined]
            linears[id(linear)] = linear
    return sum(linear.nbytes for linear in linears.values())


def _memory_mib() -> dict[str, float]:
    """The process's resident memory, and its anonymous part (the file's pages aside)."""
    fields = {}
    with open("/proc/self/status") as status:
        for line in status:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "RssAnon"):
                fields[key] = int(value.split()[0]) / 1024
    return {"rss_mib": fields.get("VmRSS", 0.0), "anon_mib": fields.get("RssAnon", 0.0)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="qwen2.5-coder-1.5b")
    parser.add_argument("--weights", default="bf16,gguf", help="formats, comma-separated")
    parser.add_argument("--prompt", type=int, default=1024, help="prompt tokens")
    parser.add_argument("--chunks", default="512,64", help="prefill chunk sizes")
    parser.add_argument("--decode", type=int, default=32, help="tokens decoded after it")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="most threads (default: all)")
    parser.add_argument(
        "--cache-mb", type=int, default=256, help="the KV pool: enough for the prompt's tokens"
    )
    parser.add_argument(
        "--linear-rows", default="", help="row counts to time every linear at, comma-separated"
    )
    parser.add_argument(
        "--together", action="store_true", help="all formats in one process, run by run in turn"
    )
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # a child's run
    args = parser.parse_args()
    chunks = [int(c) for c in args.chunks.split(",")]
    args.linear_rows = [int(r) for r in args.linear_rows.split(",") if r]
    if args.one:
        print(json.dumps(measure(args, args.weights, chunks)))
        return
    runs: dict[str, list[dict[str, Any]]] = {}
    if args.together:  # the host's load falls on every format alike
        runners = {w: load(args, w)[0] for w in args.weights.split(",")}
        for _ in range(args.runs):
            for name, runner in runners.items():
                runs.setdefault(name, []).append(timed(runner, args, chunks))
        report(args.model, runs)
        return
    for _ in range(args.runs):
        for weights in args.weights.split(","):
            child = [sys.executable, __file__, *sys.argv[1:], "--one", "--weights", weights]
            done = subprocess.run(child, capture_output=True, text=True)
            if done.returncode != 0:
                raise SystemExit(f"the {weights} run failed:\n{done.stderr[-2000:]}")
            out = done.stdout
            runs.setdefault(weights, []).append(json.loads(out.strip().splitlines()[-1]))
    report(args.model, runs)


def report(model: str, runs: dict[str, list[dict[str, Any]]]) -> None:
    print(f"{model}, torch {torch.__version__}, {os.cpu_count()} CPUs; medians of runs")
    keys = [k for k in next(iter(runs.values()))[0] if k != "weights"]
    print("| weights | " + " | ".join(keys) + " |")
    print("|---" * (len(keys) + 1) + "|")
    for name, figures in runs.items():
        cells = [f"{statistics.median(f[k] for f in figures):.2f}" for k in keys]
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
