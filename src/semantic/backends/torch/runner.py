"""TorchRunner: the torch `ModelRunner`. Owns the model, the KV pool tensors, the per-step inputs
(positions, slot mapping, block tables) and the choice of device, dtype and CPU kernels."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import torch

from semantic.backends.torch.attention import (
    DTYPES,
    AttentionMetadata,
    AttentionView,
    DecodeGroup,
    KVPool,
    PrefillChunk,
)
from semantic.backends.torch.kernels import CpuKernels, cpu_kernels
from semantic.backends.torch.linear import linear_factory
from semantic.backends.torch.models import build_model
from semantic.backends.torch.models.layers import Build
from semantic.backends.torch.sampling import sample
from semantic.core import Batch, BatchItem, CacheSpec
from semantic.engine.runner import step_tokens
from semantic.errors import ModelLoadFailed
from semantic.kv_budget import auto_budget_bytes, host_available_bytes
from semantic.models.config import ModelConfig
from semantic.text.grammar import GrammarStates

_DTYPE_NAMES = {torch_dtype: name for name, torch_dtype in DTYPES.items()}


@dataclass(slots=True, frozen=True)
class StepInputs:
    """One step's tensors. The layout puts the single-token items first (batched decode), then
    each prefill chunk; the sampled rows say where each sampled item's last token landed."""

    input_ids: torch.Tensor  # [T]
    positions: torch.Tensor  # [T]
    meta: AttentionMetadata
    sample_rows: torch.Tensor | None  # [N] rows of the hidden state to sample; None: all rows
    sampled_items: list[BatchItem]  # the N items with sample=True, in layout order
    sampled_index: list[int]  # their batch indices


class TorchRunner:
    """The model bound to its block pool. Stateless between steps apart from the pool contents,
    which the engine's block tables name."""

    def __init__(
        self,
        config: ModelConfig,
        weights: Iterable[tuple[str, np.ndarray]],
        *,
        block_tokens: int,
        cache_budget_mb: int | None,
        dtype: str = "auto",
        device: str = "auto",
        threads: int | None = None,
        kernels: bool = True,
    ) -> None:
        if threads is not None:
            torch.set_num_threads(threads)  # process-wide: this runner is the process's compute
        self.device = pick_device(device)
        self.dtype = pick_dtype(dtype, self.device)
        cpu = pick_cpu_kernels(kernels, self.device, self.dtype)
        linear = linear_factory(self.device, self.dtype, cpu)
        with torch.inference_mode():
            self.model = build_model(Build(config, self.dtype, self.device, linear, cpu), weights)
        windows = self.model.layer_windows
        self.cache_spec = CacheSpec(
            num_layers=config.num_hidden_layers,
            num_kv_heads=config.num_key_value_heads,
            head_dim=config.head_dim,
            dtype=_DTYPE_NAMES[self.dtype],
            block_tokens=block_tokens,
            layer_windows=windows if any(w is not None for w in windows) else (),
        )
        budget = self._auto_budget_bytes() if cache_budget_mb is None else cache_budget_mb * 2**20
        self.num_blocks = budget // self.cache_spec.bytes_per_block
        if self.num_blocks < 1:
            raise ModelLoadFailed(
                f"cache_budget_mb={budget // 2**20} holds no block of "
                f"{self.cache_spec.bytes_per_block} bytes"
            )
        in_place = cpu is not None and cpu.supports_attention(
            config.head_dim, config.num_attention_heads, self.dtype
        )
        self.pool = KVPool(self.cache_spec, self.num_blocks, self.device, cpu if in_place else None)
        self.vocab_size = config.vocab_size
        self.grammars = GrammarStates(config.vocab_size)

    def _auto_budget_bytes(self) -> int:
        """The pool's share of the memory left once the weights are in (`kv_budget.py`)."""
        if self.device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(self.device)
            return auto_budget_bytes(free, gpu=True)
        return auto_budget_bytes(host_available_bytes(), gpu=False)

    def run(self, batch: Batch) -> list[int | None]:
        """One step: K/V into the pool, one sampled token per item with sample=True (a row
        that cannot be sampled fails alone: `ModelRunner.run`)."""
        self._copy_blocks(batch.copies)
        step = self.prepare(batch)
        outcomes = sample(self._logits(step), step.sampled_items, self.grammars)
        return step_tokens(len(batch.items), zip(step.sampled_index, outcomes, strict=True))

    def forget(self, seq_id: int) -> None:
        self.grammars.release(seq_id)

    def forward_logits(self, batch: Batch) -> torch.Tensor:
        """Like `run` but return fp32 logits [N, V] of the sample=True items, in batch order."""
        self._copy_blocks(batch.copies)
        step = self.prepare(batch)
        logits = self._logits(step)
        order = sorted(range(len(step.sampled_index)), key=step.sampled_index.__getitem__)
        return logits[order]

    def _logits(self, step: StepInputs) -> torch.Tensor:
        if step.input_ids.shape[0] == 0:  # a step of block copies only
            return torch.empty((0, self.vocab_size), device=self.device)
        with torch.inference_mode():
            hidden = self.model.forward(step.input_ids, step.positions, self.pool.layers, step.meta)
            if step.sample_rows is not None:
                hidden = hidden[step.sample_rows]
            if hidden.shape[0] == 0:  # a step of mid-prompt chunks only: no head to run
                return hidden.new_empty((0, self.vocab_size), dtype=torch.float32)
            return self.model.logits(hidden)

    def read_block(self, block: int) -> tuple[np.ndarray, np.ndarray]:
        """A host copy of one block's K and V, `[layers, block_tokens, kv_heads, head_dim]`;
        bf16/fp16 as raw uint16 bits (numpy has no bf16)."""
        kv = self.pool.data[:, :, block].to("cpu", copy=True)  # [2, L, bt, KVH, D]
        return _host_array(kv[0]), _host_array(kv[1])

    def write_block(self, block: int, k: np.ndarray, v: np.ndarray) -> None:
        for index, array in enumerate((k, v)):
            self.pool.data[index, :, block].copy_(_device_tensor(array, self.dtype))

    def _copy_blocks(self, copies: list[tuple[int, int]]) -> None:
        """Copy-on-write of reused partial blocks: all layers, K and V, before the step."""
        for source, destination in copies:
            self.pool.data[:, :, destination].copy_(self.pool.data[:, :, source])

    def prepare(self, batch: Batch) -> StepInputs:
        """The step's flat tokens and attention metadata, from plain Python lists; the masks
        only for the stock attention path, as the CPU kernels never read them."""
        spec = self.cache_spec
        masks = self.pool.kernels is None
        return build_step(
            batch, spec.block_tokens, self.device, masks=masks, windows=spec.sliding_windows
        )


def build_step(
    batch: Batch,
    block_tokens: int,
    device: torch.device,
    *,
    masks: bool = True,
    windows: Iterable[int] = (),
) -> StepInputs:
    """The step's flat tokens, positions and attention metadata (decodes first, then chunks).
    `masks=False` leaves out the attention masks and the sliding `windows`' own views, which
    only the stock attention path reads."""
    return _StepBuilder(block_tokens, device, masks, tuple(windows) if masks else ()).build(batch)


class _StepBuilder:
    """Builds `StepInputs`: lists in Python, then a handful of tensor constructions, because
    each small tensor op costs microseconds and a decode step has little else to do."""

    def __init__(
        self, block_tokens: int, device: torch.device, masks: bool, windows: tuple[int, ...]
    ) -> None:
        self.bt = block_tokens
        self.device = device
        self.masks = masks
        self.windows = windows
        self.ids: list[int] = []
        self.positions: list[int] = []
        self.slots: list[int] = []

    def build(self, batch: Batch) -> StepInputs:
        items = batch.items
        decodes = [i for i, item in enumerate(items) if len(item.token_ids) == 1]
        chunks = [i for i, item in enumerate(items) if len(item.token_ids) > 1]
        decode = self._decode_group([items[i] for i in decodes]) if decodes else None
        prefills = [self._prefill_chunk(items[i]) for i in chunks]
        windowed = {
            w: AttentionView(
                self._windowed_decode([items[i] for i in decodes], w) if decodes else None,
                [
                    self._windowed_chunk(items[i], chunk.offset, w)
                    for i, chunk in zip(chunks, prefills, strict=True)
                ],
            )
            for w in self.windows
        }
        flat = torch.tensor([self.ids, self.positions, self.slots], dtype=torch.int64)
        flat = flat.to(self.device)
        # Each item's last token: decodes are rows 0..B-1, chunks end at offset + length - 1.
        ends = list(range(len(decodes))) + [c.offset + c.length - 1 for c in prefills]
        sampled = [
            (end, i) for end, i in zip(ends, decodes + chunks, strict=True) if items[i].sample
        ]
        rows = [end for end, _ in sampled]
        return StepInputs(
            input_ids=flat[0],
            positions=flat[1],
            meta=AttentionMetadata(flat[2], decode, prefills, windowed),
            sample_rows=self._rows(rows) if rows != list(range(len(self.ids))) else None,
            sampled_items=[items[i] for _, i in sampled],
            sampled_index=[i for _, i in sampled],
        )

    def _rows(self, rows: list[int]) -> torch.Tensor:
        return torch.tensor(rows, dtype=torch.int64, device=self.device)

    def _decode_group(self, items: list[BatchItem]) -> DecodeGroup:
        bt = self.bt
        lengths = []
        for item in items:
            pos = item.start_pos
            self.ids.append(item.token_ids[0])
            self.positions.append(pos)
            self.slots.append(item.block_table[pos // bt] * bt + pos % bt)
            lengths.append(pos + 1)
        keys = max(lengths)
        width = -(-keys // bt)
        tables = [(item.block_table + [0] * width)[:width] for item in items]
        block_tables = torch.tensor(tables, dtype=torch.int64, device=self.device)
        context_lens = torch.tensor(lengths, dtype=torch.int64, device=self.device)
        mask = None
        if self.masks and min(lengths) < keys:
            key_pos = torch.arange(keys, device=self.device)
            mask = (key_pos < context_lens[:, None])[:, None, None, :]  # [B, 1, 1, S]
        return DecodeGroup(len(items), keys, block_tables, context_lens, mask)

    def _prefill_chunk(self, item: BatchItem) -> PrefillChunk:
        bt, start, n = self.bt, item.start_pos, len(item.token_ids)
        offset = len(self.ids)
        self.ids.extend(item.token_ids)
        self.positions.extend(range(start, start + n))
        for block in range(start // bt, -(-(start + n) // bt)):
            base = item.block_table[block] * bt
            lo, hi = max(start, block * bt), min(start + n, (block + 1) * bt)
            self.slots.extend(range(base + lo - block * bt, base + hi - block * bt))
        if start == 0:
            return PrefillChunk(offset, n, 0, None, None)
        total = start + n
        block_ids = torch.tensor(item.block_table[: -(-total // bt)], device=self.device)
        mask = None
        if self.masks:  # [n, total]: ~n · total bytes, megabytes per chunk at long context
            mask = torch.ones(n, total, dtype=torch.bool, device=self.device).tril_(start)
        return PrefillChunk(offset, n, start, block_ids, mask)

    def _windowed_decode(self, items: list[BatchItem], window: int) -> DecodeGroup:
        """The decode group as a sliding layer's stock path reads it: each sequence's blocks
        from the one holding its window's first key, the keys before that masked."""
        bt = self.bt
        tables, spans = [], []
        for item in items:
            length = item.start_pos + 1
            base = max(0, length - window) // bt * bt
            tables.append(item.block_table[base // bt : -(-length // bt)])
            spans.append((max(0, length - window) - base, length - base))
        keys = max(end for _, end in spans)
        width = -(-keys // bt)
        padded = [(table + [0] * width)[:width] for table in tables]
        block_tables = torch.tensor(padded, dtype=torch.int64, device=self.device)
        lens = torch.tensor([end for _, end in spans], dtype=torch.int64, device=self.device)
        starts = torch.tensor([lo for lo, _ in spans], dtype=torch.int64, device=self.device)
        key_pos = torch.arange(keys, device=self.device)
        visible = (key_pos >= starts[:, None]) & (key_pos < lens[:, None])
        return DecodeGroup(len(items), keys, block_tables, lens, visible[:, None, None, :])

    def _windowed_chunk(self, item: BatchItem, offset: int, window: int) -> PrefillChunk:
        """A chunk as a sliding layer's stock path reads it: its keys from the block holding
        the first query's window, and a mask that is causal and ends each query's window."""
        bt, start, n = self.bt, item.start_pos, len(item.token_ids)
        total = start + n
        first_key = max(0, start - window + 1) // bt * bt
        if start == 0 and n <= window:  # no context and nothing outside the window: causal
            return PrefillChunk(offset, n, 0, None, None)
        block_ids = None
        if start > 0:
            table = item.block_table[first_key // bt : -(-total // bt)]
            block_ids = torch.tensor(table, dtype=torch.int64, device=self.device)
        query_pos = torch.arange(start, total, device=self.device)[:, None]
        key_pos = torch.arange(first_key if start > 0 else 0, total, device=self.device)[None]
        mask = (key_pos <= query_pos) & (key_pos > query_pos - window)
        return PrefillChunk(offset, n, start, block_ids, mask, first_key if start > 0 else 0)


def _host_array(tensor: torch.Tensor) -> np.ndarray:
    if tensor.dtype == torch.float32:
        return tensor.contiguous().numpy()
    return tensor.contiguous().view(torch.int16).numpy().view(np.uint16)


def _device_tensor(array: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    if dtype == torch.float32:
        return torch.from_numpy(np.ascontiguousarray(array, dtype=np.float32))
    bits = np.ascontiguousarray(array, dtype=np.uint16).view(np.int16)
    return torch.from_numpy(bits).view(dtype)


def pick_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def pick_cpu_kernels(wanted: bool, device: torch.device, dtype: torch.dtype) -> CpuKernels | None:
    """Our compiled CPU kernels where they apply (CPU, bf16 or fp32) and build; else None."""
    if not wanted or device.type != "cpu" or dtype not in (torch.bfloat16, torch.float32):
        return None
    return cpu_kernels()


def pick_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """A named dtype, or for "auto": bf16 where the hardware computes it natively, else fp32."""
    if dtype != "auto":
        if dtype not in DTYPES:
            raise ModelLoadFailed(f"unknown dtype {dtype!r}; known: auto, {', '.join(DTYPES)}")
        return DTYPES[dtype]
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    native_bf16 = torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()
    return torch.bfloat16 if native_bf16 else torch.float32
