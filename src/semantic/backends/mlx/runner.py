"""MLXRunner: the MLX `ModelRunner` (the default on Apple Silicon). Owns the model, the KV pool's
arrays and the choice of device and dtype; builds each step's inputs, evaluates the step's graph
once, and samples on the host (`sampling.py`)."""

from __future__ import annotations

from collections.abc import Iterable

import mlx.core as mx
import numpy as np

from semantic.backends.kv_budget import auto_budget_bytes, host_available_bytes, no_page_refusal
from semantic.backends.mlx.attention import StepInputs, build_step
from semantic.backends.mlx.layers import WEIGHT_FORMATS
from semantic.backends.mlx.models import Build, build_model
from semantic.backends.mlx.pool import DTYPES, KVPool
from semantic.backends.mlx.sampling import sample
from semantic.cache.pages.page import PageKV
from semantic.core import KV_QUANTIZED, Batch, CacheSpec
from semantic.engine.runner import StepToken, step_tokens
from semantic.errors import ModelLoadFailed
from semantic.models.config import ModelConfig
from semantic.text.grammar import GrammarStates


class MLXRunner:
    """The model bound to its block pool. Stateless between steps apart from the pool contents,
    which the engine's block tables name.

    The torch backend's own settings (threads, its kernels, prepared weights, CUDA graphs, the
    graphs' sizes) arrive as `torch_options` and mean nothing here."""

    def __init__(
        self,
        config: ModelConfig,
        weights: Iterable[tuple[str, np.ndarray]],
        *,
        block_tokens: int,
        cache_budget_mb: int | None,
        dtype: str = "auto",
        kv_dtype: str = "auto",
        device: str = "auto",
        weight_format: str = "bf16",
        **torch_options: object,
    ) -> None:
        self.device = pick_device(device)
        mx.set_default_device(self.device)  # for the load; each step names its device too
        self.dtype = pick_dtype(dtype, self.device)
        if weight_format not in WEIGHT_FORMATS:
            known = ", ".join(WEIGHT_FORMATS)
            raise ModelLoadFailed(
                f"weights {weight_format!r} are not the mlx backend's; known: {known}"
            )
        self.model = build_model(Build(config, DTYPES[self.dtype], weight_format), weights)
        # MLX's streams belong to the thread that made them: what the build left lazy (fused
        # q/k/v and gate/up concatenations, quantizations) is computed here, on the load's
        # thread, never first on the engine's, which has no such stream.
        mx.eval(_arrays_in(self.model))
        self.cache_spec = CacheSpec.of_model(
            config,
            self.model.layer_windows,
            dtype=self.dtype,
            block_tokens=block_tokens,
            kv_dtype=pick_kv_dtype(kv_dtype),
        )
        budget = self._auto_budget() if cache_budget_mb is None else cache_budget_mb * 2**20
        self.num_blocks = budget // self.cache_spec.bytes_per_page
        if self.num_blocks < 1:
            raise ModelLoadFailed(
                no_page_refusal(budget // 2**20, self.cache_spec, config.max_position_embeddings)
            )
        self.pool = KVPool(self.cache_spec, self.num_blocks)
        self.vocab_size = config.vocab_size
        self.grammars = GrammarStates(config.vocab_size)

    @staticmethod
    def _auto_budget() -> int:
        """The pool's share of the memory left once the weights are in (`kv_budget.py`): on
        Apple Silicon the GPU's memory is the host's."""
        return auto_budget_bytes(host_available_bytes(), gpu=False)

    def run(self, batch: Batch) -> list[StepToken]:
        """One step: K/V into the pool, one sampled token per item with sample=True (a row
        that cannot be sampled fails alone: `ModelRunner.run`). It verifies no drafts: the
        engine gives it none (no `verifies_drafts`)."""
        with mx.stream(self.device):  # the engine's thread, not the load's
            self._copy_blocks(batch.copies)
            logits, step = self._logits(batch)
        outcomes = sample(logits, step.sampled_items, self.grammars)
        return step_tokens(len(batch.items), zip(step.sampled_index, outcomes, strict=True))

    def forget(self, seq_id: int) -> None:
        self.grammars.release(seq_id)

    def forward_logits(self, batch: Batch) -> np.ndarray:
        """Like `run` but return fp32 logits [N, V] of the sample=True items, in batch order."""
        with mx.stream(self.device):
            self._copy_blocks(batch.copies)
            logits, step = self._logits(batch)
        order = sorted(range(len(step.sampled_index)), key=step.sampled_index.__getitem__)
        return logits[order]

    def _logits(self, batch: Batch) -> tuple[np.ndarray, StepInputs]:
        """The step evaluated (pool writes included) and the fp32 logits of its sampled items,
        on the host."""
        step = build_step(batch, self.cache_spec)
        none = np.empty((0, self.vocab_size), np.float32)
        if not batch.items:  # a step of block copies only
            mx.eval(self.pool.arrays())
            return none, step
        hidden = self.model.forward(step, self.pool)
        if not step.sampled_items:  # mid-prompt chunks only: their K/V, and no head to run
            mx.eval(self.pool.arrays())
            return none, step
        if step.sample_rows is not None:
            hidden = hidden[step.sample_rows]
        logits = self.model.logits(hidden)
        mx.eval(logits, self.pool.arrays())
        return np.array(logits), step

    def read_block(self, block: int) -> PageKV:
        with mx.stream(self.device):
            return self.pool.read_page(block)

    def write_block(self, block: int, kv: PageKV) -> None:
        with mx.stream(self.device):
            self.pool.write_page(block, kv)

    def _copy_blocks(self, copies: list[tuple[int, int]]) -> None:
        """Copy-on-write of reused partial blocks' pages, before the step (evaluated with it:
        the step's graph reads the copies after they are made)."""
        for source, destination in copies:
            self.pool.copy_page(source, destination)


def pick_device(device: str) -> mx.Device:
    """The device named, or for "auto" MLX's default: the GPU on Apple Silicon, else the CPU."""
    if device == "auto":
        return mx.default_device()
    if device == "cpu":
        return mx.Device(mx.cpu)
    if device == "gpu":
        return mx.Device(mx.gpu)
    raise ModelLoadFailed(f"the mlx backend has no device {device!r}; known: auto, cpu, gpu")


def pick_dtype(dtype: str, device: mx.Device) -> str:
    """A named dtype, or for "auto": bf16 on the GPU; fp32 on the CPU, where MLX computes bf16
    no faster."""
    if dtype == "auto":
        return "bfloat16" if device == mx.Device(mx.gpu) else "float32"
    if dtype not in DTYPES:
        raise ModelLoadFailed(f"unknown dtype {dtype!r}; known: auto, {', '.join(DTYPES)}")
    return dtype


def pick_kv_dtype(kv_dtype: str) -> str | None:
    """How the pool stores K/V (`CacheSpec.kv_dtype`): None in the model's dtype ("auto" and
    "model": MLX reads an 8-bit pool by widening what it gathers, as the torch backend's stock
    path does, so 8 bits saves memory, not time), or "int8"."""
    if kv_dtype in ("auto", "model"):
        return None
    if kv_dtype not in KV_QUANTIZED:
        known = ", ".join(("auto", "model", *KV_QUANTIZED))
        raise ModelLoadFailed(f"unknown kv_dtype {kv_dtype!r}; known: {known}")
    return kv_dtype


def _arrays_in(value: object, seen: set[int] | None = None) -> list[mx.array]:
    """Every array `value` holds, through lists, tuples, dicts and objects' attributes."""
    if isinstance(value, mx.array):
        return [value]
    seen = set() if seen is None else seen
    if id(value) in seen:
        return []
    seen.add(id(value))
    if isinstance(value, list | tuple):
        items: Iterable[object] = value
    elif isinstance(value, dict):
        items = value.values()
    else:
        items = getattr(value, "__dict__", {}).values()
    return [array for item in items for array in _arrays_in(item, seen)]
