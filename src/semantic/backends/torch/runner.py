"""TorchRunner: the torch `ModelRunner`. Owns the model, the KV pool tensors, the per-step inputs
(positions, slot mapping, block tables), the choice of device, dtype and kernels (our CPU
kernels, or Triton's on CUDA), and on CUDA the decode steps' graphs."""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from semantic.backends.kv_budget import auto_budget_bytes, host_available_bytes, no_page_refusal
from semantic.backends.torch.attention import (
    DTYPES,
    AttentionMetadata,
    DecodeGroup,
    GroupView,
    KVPool,
    PrefillChunk,
)
from semantic.backends.torch.blocks import block_factory
from semantic.backends.torch.kernels import CpuKernels, cpu_kernels
from semantic.backends.torch.linear import WEIGHT_FORMATS, linear_factory
from semantic.backends.torch.models import build_model
from semantic.backends.torch.models.experts import routes_on_host
from semantic.backends.torch.models.layers import Build
from semantic.backends.torch.prepared import PreparedWeights
from semantic.backends.torch.threads import ThreadGovernor
from semantic.backends.torch.verification import sample_or_verify
from semantic.cache.pages.page import PageKV
from semantic.core import KV_QUANTIZED, Batch, BatchItem, CacheSpec
from semantic.engine.runner import StepToken, step_tokens
from semantic.errors import ModelLoadFailed
from semantic.models.config import ModelConfig
from semantic.models.q6k import Blocks
from semantic.text.grammar import GrammarStates

if TYPE_CHECKING:
    from semantic.backends.torch.cuda.graphs import DecodeGraphs
    from semantic.backends.torch.cuda.kernels import CudaKernels

    # Ours: the CPU's compiled kernels, or Triton's on CUDA.
    Kernels = CpuKernels | CudaKernels

_DTYPE_NAMES = {torch_dtype: name for name, torch_dtype in DTYPES.items()}


@dataclass(slots=True, frozen=True)
class StepInputs:
    """One step's tensors. The layout puts the single-token items first (batched decode), then
    each prefill chunk (a decode with a draft is one); the sampled rows say where each sampled
    item's last token landed (a draft's item: each of its tokens, the decode token's first)."""

    input_ids: torch.Tensor  # [T]
    positions: torch.Tensor  # [T]
    meta: AttentionMetadata
    sample_rows: torch.Tensor | None  # [R] rows of the hidden state to sample; None: all rows
    sampled_items: list[BatchItem]  # the N items with sample=True, in layout order
    sampled_index: list[int]  # their batch indices


class TorchRunner:
    """The model bound to its block pool. Stateless between steps apart from the pool contents,
    which the engine's block tables name. Verifies drafts (`verification.py`) on the eager
    path: a step with one never replays a CUDA graph."""

    verifies_drafts = True

    def __init__(
        self,
        config: ModelConfig,
        weights: Iterable[tuple[str, np.ndarray | Blocks]],
        *,
        block_tokens: int,
        cache_budget_mb: int | None,
        dtype: str = "auto",
        kv_dtype: str = "auto",
        device: str = "auto",
        threads: int | None = None,
        kernels: bool | Kernels = True,
        weight_format: str = "bf16",
        prepared_dir: Path | None = None,
        weights_fingerprint: str | None = None,
        cuda_graphs: bool = True,
        max_decode_batch: int = 64,
        max_seq_len: int | None = None,
    ) -> None:
        if threads is not None:
            torch.set_num_threads(threads)  # process-wide: this runner is the process's compute
        self.device = pick_device(device)
        self.threads = thread_governor(self.device)
        self.dtype = pick_dtype(dtype, self.device)
        cpu, ours = pick_kernels(kernels, self.device, self.dtype)
        if weight_format not in WEIGHT_FORMATS:
            known = ", ".join(WEIGHT_FORMATS)
            raise ModelLoadFailed(
                f"weights {weight_format!r} are not the torch backend's; known: {known}"
            )
        linear = linear_factory(self.device, self.dtype, cpu, weight_format)
        blocks = block_factory(self.device, self.dtype, cpu, weight_format)
        build = Build(config, self.dtype, self.device, linear, ours, weight_format, blocks)
        with torch.inference_mode():
            # A GGUF's blocks load without a conversion worth keeping: never prepared.
            if not (prepared_dir and weights_fingerprint and cpu) or weight_format == "gguf":
                self.model = build_model(build, weights)
            else:  # our kernels' layout, kept for the next start (prepared.py)
                prepared = PreparedWeights.for_model(prepared_dir, weights_fingerprint, build)
                self.model = prepared.build(build, weights)
        in_place = attention_kernels(ours, config, self.dtype)
        self.cache_spec = CacheSpec.of_model(
            config,
            self.model.layer_windows,
            dtype=_DTYPE_NAMES[self.dtype],
            block_tokens=block_tokens,
            kv_dtype=pick_kv_dtype(
                kv_dtype, attention_kernels(cpu, config, self.dtype) is not None, self.dtype
            ),
        )
        budget = self._auto_budget_bytes() if cache_budget_mb is None else cache_budget_mb * 2**20
        self.num_blocks = budget // self.cache_spec.bytes_per_page  # pages, one size for all
        if self.num_blocks < 1:
            context = config.max_position_embeddings
            seq_len = min(context, max_seq_len or context)
            raise ModelLoadFailed(no_page_refusal(budget // 2**20, self.cache_spec, seq_len))
        graphs = cuda_graphs and self.device.type == "cuda" and in_place is not None
        graphs = graphs and not routes_on_host(self.model)
        # With graphs, one page past the engine's holds the padding rows' K/V (cuda/graphs.py).
        pages = self.num_blocks + 1 if graphs else self.num_blocks
        self.pool = KVPool(self.cache_spec, pages, self.device, in_place)
        self.vocab_size = config.vocab_size
        self.grammars = GrammarStates(config.vocab_size)
        self.graphs: DecodeGraphs | None = None
        if graphs:
            context = config.max_position_embeddings
            seq_len = min(context, max_seq_len or context)
            self.graphs = self._capture_graphs(max_decode_batch, seq_len)

    def _capture_graphs(self, max_batch: int, seq_len: int) -> DecodeGraphs:
        from semantic.backends.torch.cuda.graphs import CAPTURE_BUDGET_S, DecodeGraphs

        graphs = DecodeGraphs(
            self.model,
            self.pool.layers,
            groups=len(self.cache_spec.groups),
            block_tokens=self.cache_spec.block_tokens,
            max_blocks=-(-seq_len // self.cache_spec.block_tokens),
            spare_page=self.num_blocks,
            max_batch=max_batch,
            device=self.device,
        )
        try:
            with torch.inference_mode():
                graphs.capture(CAPTURE_BUDGET_S)
        except RuntimeError as exc:  # a kernel that cannot be captured, or no memory for it
            raise ModelLoadFailed(
                f"capturing the decode steps' CUDA graphs failed ({exc}); "
                "--no-cuda-graphs runs without them"
            ) from exc
        return graphs

    def _auto_budget_bytes(self) -> int:
        """The pool's share of the memory left once the weights are in (`kv_budget.py`)."""
        if self.device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(self.device)
            return auto_budget_bytes(free, gpu=True)
        return auto_budget_bytes(host_available_bytes(), gpu=False)

    def run(self, batch: Batch) -> list[StepToken]:
        """One step: K/V into the pool, one sampled token per item with sample=True, or a
        verified draft's tokens (a row that cannot be sampled fails alone: `ModelRunner.run`)."""
        if self.threads is not None:
            self.threads.adjust()
        self._copy_blocks(batch.copies)
        logits, items, index = self._sampled_logits(batch)
        outcomes = sample_or_verify(logits, items, self.grammars)
        return step_tokens(len(batch.items), zip(index, outcomes, strict=True))

    def forget(self, seq_id: int) -> None:
        self.grammars.release(seq_id)

    def forward_logits(self, batch: Batch) -> torch.Tensor:
        """Like `run` but return fp32 logits [N, V] of the sample=True items, in batch order
        (an item with a draft: a row at its decode token and at each draft token)."""
        self._copy_blocks(batch.copies)
        logits, items, index = self._sampled_logits(batch)
        starts = itertools.accumulate((1 + len(item.draft_token_ids) for item in items), initial=0)
        rows = {
            i: range(start, start + 1 + len(item.draft_token_ids))
            for i, start, item in zip(index, starts, items, strict=False)
        }
        return logits[[row for i in sorted(rows) for row in rows[i]]]

    def _sampled_logits(self, batch: Batch) -> tuple[torch.Tensor, list[BatchItem], list[int]]:
        """fp32 logits of the items to sample, those items and their batch indices: a batch of
        decodes by its graph where one was captured, any other eagerly."""
        if self.graphs is not None:
            with torch.inference_mode():
                logits = self.graphs.logits(batch.items)
            if logits is not None:
                return logits, batch.items, list(range(len(batch.items)))
        step = self.prepare(batch)
        return self._logits(step), step.sampled_items, step.sampled_index

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

    def read_block(self, block: int) -> PageKV:
        return self.pool.read_page(block)

    def write_block(self, block: int, kv: PageKV) -> None:
        self.pool.write_page(block, kv)

    def _copy_blocks(self, copies: list[tuple[int, int]]) -> None:
        """Copy-on-write of reused partial blocks' pages: K and V of the page's layers, before
        the step."""
        for source, destination in copies:
            self.pool.copy_page(source, destination)

    def prepare(self, batch: Batch) -> StepInputs:
        """The step's flat tokens and attention metadata, from plain Python lists; the masks
        only for the stock attention path, as our kernels never read them."""
        spec = self.cache_spec
        masks = self.pool.kernels is None
        return build_step(
            batch, spec.block_tokens, self.device, masks=masks, group_windows=spec.group_windows
        )


def build_step(
    batch: Batch,
    block_tokens: int,
    device: torch.device,
    *,
    masks: bool = True,
    group_windows: Sequence[int | None] = (None,),
) -> StepInputs:
    """The step's flat tokens, positions and attention metadata (decodes first, then chunks),
    with a view per layer group (`group_windows`: each group's sliding window, None for full
    attention). `masks=False` leaves out the attention masks and the windows' own views, which
    only the stock attention path reads."""
    return _StepBuilder(block_tokens, device, masks, tuple(group_windows)).build(batch)


class _StepBuilder:
    """Builds `StepInputs`: lists in Python, then a handful of tensor constructions, because
    each small tensor op costs microseconds and a decode step has little else to do. What a
    window decides (lengths, masks) is built once per window, shared by its groups; each group
    has its own block tables and slots."""

    def __init__(
        self,
        block_tokens: int,
        device: torch.device,
        masks: bool,
        group_windows: tuple[int | None, ...],
    ) -> None:
        self.bt = block_tokens
        self.device = device
        self.masks = masks
        # The stock path reads a sliding group's window through its own view; our kernels read
        # every group through whole tables, given the window.
        self.windows = group_windows if masks else (None,) * len(group_windows)
        self._decode_spans: dict[int | None, _DecodeSpans] = {}

    def build(self, batch: Batch) -> StepInputs:
        items = batch.items
        decodes = [i for i, item in enumerate(items) if _decodes(item)]
        chunks = [i for i, item in enumerate(items) if not _decodes(item)]
        # A draft is verified as decodes of its tokens, one a position: each then attends as
        # plain decoding's would (a chunk's attention rounds otherwise), so its logits are bit
        # for bit those of decoding one token a step, and a greedy row's tokens are theirs.
        singles = [single for i in decodes for single in _one_a_position(items[i])]
        ids, positions, slots = self._layout(singles + [items[i] for i in chunks])
        flat = torch.tensor([ids, positions, *slots], dtype=torch.int64).to(self.device)
        offsets = list(itertools.accumulate((len(items[i].token_ids) for i in chunks), initial=0))
        offsets = [len(singles) + offset for offset in offsets]
        views = [
            GroupView(
                flat[2 + group],
                self._decode_group(singles, group) if decodes else None,
                [
                    self._prefill_chunk(items[i], offset, group)
                    for i, offset in zip(chunks, offsets, strict=False)
                ],
            )
            for group in range(len(self.windows))
        ]
        # Each item's last token: decodes' rows come first, chunks end before the next offset.
        decode_ends = itertools.accumulate(len(items[i].token_ids) for i in decodes)
        ends = [end - 1 for end in decode_ends] + [offset - 1 for offset in offsets[1:]]
        sampled = [
            (end, i) for end, i in zip(ends, decodes + chunks, strict=True) if items[i].sample
        ]
        # A draft's item is verified at its decode token and every draft token.
        rows = [
            row for end, i in sampled for row in range(end - len(items[i].draft_token_ids), end + 1)
        ]
        return StepInputs(
            input_ids=flat[0],
            positions=flat[1],
            meta=AttentionMetadata(views),
            sample_rows=self._rows(rows) if rows != list(range(len(ids))) else None,
            sampled_items=[items[i] for _, i in sampled],
            sampled_index=[i for _, i in sampled],
        )

    def _rows(self, rows: list[int]) -> torch.Tensor:
        return torch.tensor(rows, dtype=torch.int64, device=self.device)

    def _layout(self, order: list[BatchItem]) -> tuple[list[int], list[int], list[list[int]]]:
        """The step's token ids and positions, and the pool slot of each token in each layer
        group's pages, in layout order."""
        bt = self.bt
        ids: list[int] = []
        positions: list[int] = []
        slots: list[list[int]] = [[] for _ in self.windows]
        for item in order:
            start, end = item.start_pos, item.start_pos + len(item.token_ids)
            ids += item.token_ids
            if end - start == 1:  # a decode: one slot per group
                positions.append(start)
                for group_slots, table in zip(slots, item.block_tables, strict=True):
                    group_slots.append(table[start // bt] * bt + start % bt)
                continue
            positions += range(start, end)
            for group_slots, table in zip(slots, item.block_tables, strict=True):
                for block in range(start // bt, -(-end // bt)):
                    base = table[block] * bt - block * bt
                    group_slots += range(
                        base + max(start, block * bt), base + min(end, block * bt + bt)
                    )
        return ids, positions, slots

    def _decode_group(self, items: list[BatchItem], group: int) -> DecodeGroup:
        """The decode group as `group` reads it: whole tables (a sliding group's, on the stock
        path, from the block holding its window's first key, the keys before that masked)."""
        spans = self._spans(items, self.windows[group])
        width = -(-spans.num_keys // self.bt)
        tables = []
        for item, base in zip(items, spans.bases, strict=True):
            table = item.block_tables[group][base : base + width]
            tables.append(table + [0] * (width - len(table)))
        block_tables = torch.tensor(tables, dtype=torch.int64, device=self.device)
        return DecodeGroup(len(items), spans.num_keys, block_tables, spans.lens, spans.mask)

    def _spans(self, items: list[BatchItem], window: int | None) -> _DecodeSpans:
        """What the decodes read in `window`'s view (None: all their keys), built once a step."""
        spans = self._decode_spans.get(window)
        if spans is not None:
            return spans
        lengths = [item.start_pos + 1 for item in items]
        if window is None:  # every key, from the first block
            starts = bases = [0] * len(items)
            ends = lengths
        else:
            starts = [max(0, n - window) for n in lengths]
            bases = [lo // self.bt for lo in starts]
            ends = [n - base * self.bt for n, base in zip(lengths, bases, strict=True)]
        keys = max(ends)
        lens = torch.tensor(ends, dtype=torch.int64, device=self.device)
        mask = None
        if window is not None:
            first = torch.tensor(
                [lo - base * self.bt for lo, base in zip(starts, bases, strict=True)],
                dtype=torch.int64,
                device=self.device,
            )
            key_pos = torch.arange(keys, device=self.device)
            visible = (key_pos >= first[:, None]) & (key_pos < lens[:, None])
            mask = visible[:, None, None, :]
        elif self.masks and min(lengths) < keys:
            key_pos = torch.arange(keys, device=self.device)
            mask = (key_pos < lens[:, None])[:, None, None, :]  # [B, 1, 1, S]
        spans = self._decode_spans[window] = _DecodeSpans(bases, keys, lens, mask)
        return spans

    def _prefill_chunk(self, item: BatchItem, offset: int, group: int) -> PrefillChunk:
        window = self.windows[group]
        if window is not None:
            return self._windowed_chunk(item, offset, group, window)
        start, n = item.start_pos, len(item.token_ids)
        if start == 0:
            return PrefillChunk(offset, n, 0, None, None)
        total = start + n
        table = item.block_tables[group][: -(-total // self.bt)]
        block_ids = torch.tensor(table, dtype=torch.int64, device=self.device)
        mask = None
        if self.masks:  # [n, total]: ~n · total bytes, megabytes per chunk at long context
            mask = torch.ones(n, total, dtype=torch.bool, device=self.device).tril_(start)
        return PrefillChunk(offset, n, start, block_ids, mask)

    def _windowed_chunk(
        self, item: BatchItem, offset: int, group: int, window: int
    ) -> PrefillChunk:
        """A chunk as a sliding group's stock path reads it: its keys from the block holding
        the first query's window, and a mask that is causal and ends each query's window."""
        bt, start, n = self.bt, item.start_pos, len(item.token_ids)
        total = start + n
        first_key = max(0, start - window + 1) // bt * bt
        if start == 0 and n <= window:  # no context and nothing outside the window: causal
            return PrefillChunk(offset, n, 0, None, None)
        block_ids = None
        if start > 0:
            table = item.block_tables[group][first_key // bt : -(-total // bt)]
            block_ids = torch.tensor(table, dtype=torch.int64, device=self.device)
        query_pos = torch.arange(start, total, device=self.device)[:, None]
        key_pos = torch.arange(first_key if start > 0 else 0, total, device=self.device)[None]
        mask = (key_pos <= query_pos) & (key_pos > query_pos - window)
        return PrefillChunk(offset, n, start, block_ids, mask, first_key if start > 0 else 0)


def _decodes(item: BatchItem) -> bool:
    """Whether `item` is a decode (a draft's too) rather than a prompt's chunk."""
    return len(item.token_ids) == 1 or bool(item.draft_token_ids)


def _one_a_position(item: BatchItem) -> list[BatchItem]:
    """A decode with a draft as one decode a token, at its positions (a plain decode as is)."""
    if not item.draft_token_ids:
        return [item]
    return [
        replace(item, token_ids=[token], start_pos=item.start_pos + n, draft_token_ids=())
        for n, token in enumerate(item.token_ids)
    ]


@dataclass(slots=True, frozen=True)
class _DecodeSpans:
    """What one view of the step's decodes reads, whatever the group: each sequence's first
    block (`bases`), the longest span of keys, each span's length, the mask."""

    bases: list[int]
    num_keys: int
    lens: torch.Tensor  # [B] int64
    mask: torch.Tensor | None  # [B, 1, 1, S] bool


def pick_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device not in ("cpu", "cuda"):  # "gpu" is the mlx backend's
        raise ModelLoadFailed("the torch backend's devices are auto, cpu and cuda")
    return torch.device(device)


def thread_governor(device: torch.device) -> ThreadGovernor | None:
    """On the CPU, the thread count follows the other programs' load (`threads.py`)."""
    if device.type != "cpu":
        return None
    return ThreadGovernor(torch.get_num_threads(), os.cpu_count() or 1, torch.set_num_threads)


def pick_kernels(
    wanted: bool | Kernels, device: torch.device, dtype: torch.dtype
) -> tuple[CpuKernels | None, Kernels | None]:
    """Our kernels where they apply (`wanted` True), as (the CPU's compiled ones, which the
    linears use too, or None; ours, CPU or CUDA, or None: stock torch). A kernels object is
    used as given: the tests run the Triton kernels on the CPU, in Triton's interpreter."""
    if not isinstance(wanted, bool):
        return (wanted if isinstance(wanted, CpuKernels) else None), wanted
    cpu = pick_cpu_kernels(wanted, device, dtype)
    return cpu, cpu if cpu is not None else pick_cuda_kernels(wanted, device)


def pick_cpu_kernels(wanted: bool, device: torch.device, dtype: torch.dtype) -> CpuKernels | None:
    """Our compiled CPU kernels where they apply (CPU, bf16 or fp32) and build; else None."""
    if not wanted or device.type != "cpu" or dtype not in (torch.bfloat16, torch.float32):
        return None
    return cpu_kernels()


def pick_cuda_kernels(wanted: bool, device: torch.device) -> CudaKernels | None:
    """The Triton kernels on CUDA (`cuda/`), where Triton imports; else None."""
    if not wanted or device.type != "cuda":
        return None
    from semantic.backends.torch.cuda import cuda_kernels

    return cuda_kernels()


def attention_kernels(
    kernels: Kernels | None, config: ModelConfig, dtype: torch.dtype
) -> Kernels | None:
    """`kernels` where they read this model's paged attention in place (its heads and dtype),
    else None: the pool is then read by the stock kernels."""
    reads = kernels is not None and kernels.supports_attention(
        config.head_dim, config.num_attention_heads, dtype
    )
    return kernels if reads else None


def auto_weight_format(device: str, k_blocks: bool = True) -> str:
    """How a GGUF model's linears store their weights when the settings say "auto": on its own
    blocks ("gguf") on the CPU, where decode is bound by the bytes a step reads; "bf16", as
    loaded, on CUDA (torch's CUDA int4 layout is another). With our AVX-512 kernels every
    block type runs on our group kernel (Qwen2.5-Coder-1.5B: 2.3x bf16's decode and 1.3x
    int8's, its logits 1.7% of their spread from the dequantized file's where int8's are 3.0%;
    the 0.5B's Q5_0/Q8_0 as well), without them Q4_K on torch's int4 kernel beside an fp32
    model (docs/benchmark-history.md). Only for a file with Q4_K or Q5_K matrices (`k_blocks`:
    a Q4_K_M or Q5_K_M file, say): SmolLM2's Q4_1 file on its blocks decodes 2.25x faster, but
    its logits move by 7% of their spread (x quantized to int8, as int8 weights' 9.8%), enough
    to flip the README's own question at a near tie into a wrong answer, so it keeps "bf16"
    unless asked for "gguf"."""
    return "gguf" if k_blocks and pick_device(device).type == "cpu" else "bf16"


def pick_kv_dtype(kv_dtype: str, cpu_in_place: bool, dtype: torch.dtype) -> str | None:
    """How the pool stores K/V (`CacheSpec.kv_dtype`): None in the model's dtype ("model").
    "auto" is int8 where our CPU kernels read it in place (`cpu_in_place`) and the model
    computes in bf16 (there it is faster than bf16 and holds twice the tokens, and its error is
    about bf16's own: docs/design.md), else the model's dtype: an fp32 model is asked for its
    precision, the stock path dequantizes int8 on every read, and the Triton kernels' int8 on
    CUDA is yet to be measured."""
    if kv_dtype == "auto":
        return "int8" if cpu_in_place and dtype == torch.bfloat16 else None
    if kv_dtype == "model":
        return None
    if kv_dtype not in KV_QUANTIZED:
        known = ", ".join(("auto", "model", *KV_QUANTIZED))
        raise ModelLoadFailed(f"unknown kv_dtype {kv_dtype!r}; known: {known}")
    return kv_dtype


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
