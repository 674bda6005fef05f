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
    DecodeGroup,
    KVPool,
    PrefillChunk,
)
from semantic.backends.torch.kernels import CpuKernels, cpu_kernels
from semantic.backends.torch.linear import linear_factory
from semantic.backends.torch.llama import load_weights
from semantic.backends.torch.sampling import sample
from semantic.core import Batch, BatchItem, CacheSpec
from semantic.engine.runner import step_tokens
from semantic.errors import ModelLoadFailed
from semantic.kv_budget import auto_budget_bytes, host_available_bytes
from semantic.models.config import ModelConfig

_LLAMA_FAMILY = frozenset({"llama", "mistral"})
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
        if config.model_type not in _LLAMA_FAMILY:
            raise ModelLoadFailed(f"the torch backend cannot run model_type {config.model_type!r}")
        if threads is not None:
            torch.set_num_threads(threads)  # process-wide: this runner is the process's compute
        self.device = pick_device(device)
        self.dtype = pick_dtype(dtype, self.device)
        cpu = pick_cpu_kernels(kernels, self.device, self.dtype)
        with torch.inference_mode():
            self.model = load_weights(
                config,
                weights,
                dtype=self.dtype,
                device=self.device,
                linear=linear_factory(self.device, self.dtype, cpu),
                kernels=cpu,
            )
        self.cache_spec = CacheSpec(
            num_layers=config.num_hidden_layers,
            num_kv_heads=config.num_key_value_heads,
            head_dim=config.head_dim,
            dtype=_DTYPE_NAMES[self.dtype],
            block_tokens=block_tokens,
        )
        budget = self._auto_budget_bytes() if cache_budget_mb is None else cache_budget_mb * 2**20
        self.num_blocks = budget // self.cache_spec.bytes_per_block
        if self.num_blocks < 1:
            raise ModelLoadFailed(
                f"cache_budget_mb={budget // 2**20} holds no block of "
                f"{self.cache_spec.bytes_per_block} bytes"
            )
        decode = cpu is not None and cpu.supports_decode(
            config.head_dim, config.num_attention_heads, self.dtype
        )
        self.pool = KVPool(self.cache_spec, self.num_blocks, self.device, cpu if decode else None)
        self.vocab_size = config.vocab_size

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
        outcomes = sample(self._logits(step), step.sampled_items)
        return step_tokens(len(batch.items), zip(step.sampled_index, outcomes, strict=True))

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
        masks = self.pool.kernels is None
        return build_step(batch, self.cache_spec.block_tokens, self.device, masks=masks)


def build_step(
    batch: Batch, block_tokens: int, device: torch.device, *, masks: bool = True
) -> StepInputs:
    """The step's flat tokens, positions and attention metadata (decodes first, then chunks).
    `masks=False` leaves out the attention masks, which only the stock attention path reads."""
    return _StepBuilder(block_tokens, device, masks).build(batch)


class _StepBuilder:
    """Builds `StepInputs`: lists in Python, then a handful of tensor constructions, because
    each small tensor op costs microseconds and a decode step has little else to do."""

    def __init__(self, block_tokens: int, device: torch.device, masks: bool) -> None:
        self.bt = block_tokens
        self.device = device
        self.masks = masks
        self.ids: list[int] = []
        self.positions: list[int] = []
        self.slots: list[int] = []

    def build(self, batch: Batch) -> StepInputs:
        items = batch.items
        decodes = [i for i, item in enumerate(items) if len(item.token_ids) == 1]
        chunks = [i for i, item in enumerate(items) if len(item.token_ids) > 1]
        decode = self._decode_group([items[i] for i in decodes]) if decodes else None
        prefills = [self._prefill_chunk(items[i]) for i in chunks]
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
            meta=AttentionMetadata(slot_mapping=flat[2], decode=decode, prefills=prefills),
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
