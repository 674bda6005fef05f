"""Paged attention on the torch backend: the KV block pool tensors, the per-step metadata that says
where each new token's K/V goes and what each query sees, and attention over the pool.

Decode and prefill on CPU (bf16 or fp32) run our kernels (`kernels/paged_attention.cpp`,
`kernels/prefill_attention.cpp`): each sequence's blocks are read in place through its block
table, all query heads of a KV head from one load of each key; decode splits long contexts into
spans on both cores, prefill is flash-style over key tiles and skips the masked triangle. On
CUDA the Triton kernels of `cuda/attention.py` read the pool in place the same way (one
`AttentionKernels` protocol for both). Other dtypes, CPUs without the kernels (`cpu_kernels()`
is None: no AVX-512 BF16 or VNNI, or no compiler), CUDA without Triton, and the
`cpu_kernels=false` setting use the stock kernels below, which gather the blocks first.
Measured on the 2-core Zen 4 CPU (torch 2.13, SmolLM2 shapes: 9 query heads, 3 KV heads,
head_dim 64, block_tokens 256; per layer, decode's K/V cold in DRAM as in a real step, medians
on a noisy shared machine):

    decode, 8 sequences at ~1,000 tokens               µs    (1 sequence)
      our kernel, bf16 (fp32)                          330 (630)    49 (87)
      index_select gather + one SDPA, G folded         860-1320     (170-330)
      advanced-indexing gather + SDPA                  1200-1900    (200)
      gather + matmul / softmax / matmul               1100-1550    (230)
      gather + SDPA(enable_gqa=True): math path        5300
      block-wise online softmax, torch ops per block   3300
      one SDPA per sequence, no padding                5500
      torch.compile (inductor, indirect loads)         1500-2000, after a 22 s compile
    prefill, 512-token chunk without / 488 with 512 of context     ms
      our kernel, bf16 (fp32)                          1.2 (2.0) / 3.2 (5.4)
      SDPA, K/V heads repeated (the stock path)        4.3-7 / 10-15
      SDPA(enable_gqa=True): math path                 ~3x slower
      matmul / softmax / matmul                        7-8 / 10-36
      context and chunk apart, merged by logsumexp     - / 11-14
      SDPA in fp32                                     4.1-6.4 / 9.4-13

Among stock kernels gather-then-SDPA wins; its cost at long context is SDPA's fused CPU kernel
(~20 GFLOP/s on 3 queries per KV head) more than the copy. Our decode kernel reads the 6 MB of
K/V once, at ~20 GB/s of the machine's ~30. For prefill SDPA must be given an explicit mask once
a chunk has context, so it computes the whole rectangle; our kernel computes only what the
causal mask leaves (~260 GFLOP/s of bf16 products on the 2 cores), and a 1,000-token bf16
prefill in chunks of 512 goes from ~835-960 to ~1,235-1,370 tok/s, medians of three runs of 5
(transformers fp32: ~480-520, or 616 computing only the last logits).

Sliding-window layers (Gemma 3, GPT-OSS, Mistral's window) read only their window: the CPU
kernels start each query's keys at its window (whole key tiles and spans before it are never
loaded); the stock path gathers only the blocks that hold a window and masks the rest of their
first block. The pool holds a page per layer group (`core.py: CacheSpec`): a sliding group's
pages of the blocks its window has left are given back, so its block tables name no page there
(page 0 stands in, never read). Attention sinks (GPT-OSS) are a logit per head that joins the
softmax with no value: the kernels add its weight to the sum; the stock path, which SDPA cannot
give it, computes those layers' softmax itself.

An 8-bit pool (`kv_dtype = "int8"`) holds int8 K/V with a bf16 scale per token and KV head
(`int8.py` says why these scales): the step's K/V are quantized as they are written; the CPU
kernels read the int8 rows and their scales in place and dequantize in registers (decode folds
each key's scale into its score and each value's into its weight; prefill dequantizes as it
packs its key tiles); the stock path dequantizes what it gathers.
"""

from __future__ import annotations

import math
import mmap
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch
import torch.nn.functional as F

from semantic.backends.torch.int8 import SCALE_DTYPE, dequantize_rows, quantize_rows
from semantic.cache.pages.page import PageKV
from semantic.core import CacheSpec

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


class AttentionKernels(Protocol):
    """Kernels that read the pool in place: ours on the CPU (`kernels/`, `CpuKernels`) and
    Triton's on CUDA (`cuda/attention.py`). Their docstrings give the shapes; both compute
    what the stock path below computes."""

    def supports_attention(self, head_dim: int, heads: int, dtype: torch.dtype) -> bool: ...

    def decode_attention(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        block_tables: torch.Tensor,
        context_lens: torch.Tensor,
        scale: float,
        window: int | None = None,
        sinks: torch.Tensor | None = None,
        k_scales: torch.Tensor | None = None,
        v_scales: torch.Tensor | None = None,
    ) -> torch.Tensor: ...

    def prefill_attention(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        block_table: torch.Tensor | None,
        context_len: int,
        scale: float,
        window: int | None = None,
        sinks: torch.Tensor | None = None,
        k_scales: torch.Tensor | None = None,
        v_scales: torch.Tensor | None = None,
    ) -> torch.Tensor: ...

    def write_kv_int8(
        self, x: torch.Tensor, slots: torch.Tensor, cache: torch.Tensor, scales: torch.Tensor
    ) -> None: ...


class KVPool:
    """The KV cache: one tensor `[2, layers_per_group, num_pages, block_tokens, kv_heads,
    head_dim]`, where page `p` holds one layer group's K/V of one block (`data[:, :, p]`).

    These tensors ARE the cache; no sequence keeps a copy between steps. The i-th layer of every
    group reads `data[:, i]`, through its own group's block tables: one page size serves every
    group, so a page freed by a sliding group holds a full-attention group's block next (with
    one group, a page is a block of every layer). Slot `s` of a layer is token
    `s % block_tokens` of page `s // block_tokens`. Zero-filled so a padded read of a slot
    never written is finite (a masked score times NaN would still poison the output). On the CPU
    the zeros are an anonymous mapping's, which the OS hands out on first touch: the pool takes
    memory as pages are used, so a pool sized from the machine costs only what it holds.

    An 8-bit pool's `data` is int8 and `scales` `[2, layers_per_group, num_pages, block_tokens,
    kv_heads]` holds each row's scale (`int8.py`); unquantized, `scales` is None.
    """

    def __init__(
        self,
        spec: CacheSpec,
        num_pages: int,
        device: torch.device,
        kernels: AttentionKernels | None = None,
    ) -> None:
        page = (spec.block_tokens, spec.num_kv_heads, spec.head_dim)
        shape = (2, spec.layers_per_group, num_pages, *page)
        self.spec = spec
        self.kernels = kernels  # None: the stock path, which alone reads the step's masks
        dtype = DTYPES[spec.dtype]
        self.data = _zeros(shape, torch.int8 if spec.kv_dtype else dtype, device)
        self.scales = _zeros(shape[:-1], SCALE_DTYPE, device) if spec.kv_dtype else None
        scratch = GatherScratch(self.data)
        where = {
            layer: (group, i)
            for group, layers in enumerate(spec.groups)
            for i, layer in enumerate(layers.layers)
        }
        self.layers = [
            LayerKV(self.data[0, i], self.data[1, i], scratch, kernels, group, self._scales(i))
            for group, i in (where[layer] for layer in range(spec.num_layers))
        ]

    def _scales(self, i: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        return None if self.scales is None else (self.scales[0, i], self.scales[1, i])

    def _page_tensors(self) -> list[torch.Tensor]:
        """The tensors a page has a slice of (index 2): the values, and the scales if any."""
        return [self.data] if self.scales is None else [self.data, self.scales]

    def copy_page(self, source: int, destination: int) -> None:
        for tensor in self._page_tensors():
            tensor[:, :, destination].copy_(tensor[:, :, source])

    def read_page(self, page: int) -> PageKV:
        """A host copy of one page (`cache/pages/page.py`): 16-bit values and scales as raw bits."""
        arrays = [_host_array(t[which, :, page]) for t in self._page_tensors() for which in (0, 1)]
        return PageKV(*arrays)

    def write_page(self, page: int, kv: PageKV) -> None:
        """Fill one page from host arrays as `read_page` gives them."""
        pairs = ((kv.k, kv.v), (kv.k_scales, kv.v_scales))
        for tensor, pair in zip(self._page_tensors(), pairs, strict=False):
            for which, array in enumerate(pair):
                if array is None:
                    raise ValueError("an 8-bit page needs its scales")
                tensor[which, :, page].copy_(_device_tensor(array, tensor.dtype))


_NUMPY = {torch.float32: np.float32, torch.int8: np.int8}


def _host_array(tensor: torch.Tensor) -> np.ndarray:
    """A CPU copy as numpy: bf16 and fp16 as raw uint16 bits (numpy has no bf16)."""
    tensor = tensor.to("cpu", copy=True).contiguous()
    if tensor.itemsize != 2:
        return tensor.numpy()
    return tensor.view(torch.int16).numpy().view(np.uint16)


def _device_tensor(array: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    if dtype.itemsize != 2:
        return torch.from_numpy(np.ascontiguousarray(array, dtype=_NUMPY[dtype]))
    bits = np.ascontiguousarray(array, dtype=np.uint16).view(np.int16)
    return torch.from_numpy(bits).view(dtype)


def _zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    if device.type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    count = math.prod(shape)
    mapping = mmap.mmap(-1, count * dtype.itemsize)  # anonymous: zero pages until written
    return torch.frombuffer(mapping, dtype=dtype, count=count).view(shape)


class GatherScratch:
    """Two buffers, K and V, that gathers copy blocks into, reused by every layer and step.

    A layer's gathered K/V are dead once its attention returns, so one pair serves all layers;
    reusing it saves allocating (and page-faulting) megabytes per layer, ~20% of a gather.
    """

    def __init__(self, like: torch.Tensor) -> None:
        self.buffers = [like.new_empty((0, *like.shape[3:])) for _ in range(2)]

    def gather(self, cache: torch.Tensor, block_ids: torch.Tensor, which: int) -> torch.Tensor:
        # cache: [num_blocks, bt, KVH, D], block_ids: [n] → [n, bt, KVH, D]
        count = block_ids.shape[0]
        if self.buffers[which].shape[0] < count:
            self.buffers[which] = cache.new_empty((count, *cache.shape[1:]))
        out = self.buffers[which][:count]
        return torch.index_select(cache, 0, block_ids, out=out)


class LayerKV:
    """One layer's K and V pool tensors `[num_pages, block_tokens, KVH, D]`, its layer group
    (whose view of the step it reads), the gather scratch, our kernels that read the pool in
    place for decodes and prefills (CPU or Triton; None: gather + SDPA), and for an 8-bit pool
    the rows' scales, K's and V's `[num_pages, block_tokens, KVH]` (None: the model's dtype)."""

    __slots__ = ("group", "k", "k_scales", "kernels", "scratch", "v", "v_scales")

    def __init__(
        self,
        k: torch.Tensor,
        v: torch.Tensor,
        scratch: GatherScratch,
        kernels: AttentionKernels | None = None,
        group: int = 0,
        scales: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> None:
        self.k = k
        self.v = v
        self.scratch = scratch
        self.kernels = kernels
        self.group = group
        self.k_scales: torch.Tensor | None = None if scales is None else scales[0]
        self.v_scales: torch.Tensor | None = None if scales is None else scales[1]

    def gather(
        self, block_ids: torch.Tensor, batch: int, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Each of `batch` sequences' blocks (`block_ids` [batch · m]), one copy each of K and V
        in `dtype`, as [batch, KVH, m · bt, D] views. `index_select` copies whole blocks;
        advanced indexing is ~4x slower here. An 8-bit pool's rows are dequantized."""
        k = self.scratch.gather(self.k, block_ids, 0)
        v = self.scratch.gather(self.v, block_ids, 1)
        if self.k_scales is not None and self.v_scales is not None:
            k = dequantize_rows(k, self.k_scales.index_select(0, block_ids), dtype)
            v = dequantize_rows(v, self.v_scales.index_select(0, block_ids), dtype)
        shape = (batch, -1, *self.k.shape[2:])
        return k.view(shape).transpose(1, 2), v.view(shape).transpose(1, 2)


@dataclass(slots=True, frozen=True)
class DecodeGroup:
    """The step's single-token items, batched: they are the first `num_tokens` of the layout."""

    num_tokens: int
    num_keys: int  # S: the longest sequence's length
    block_tables: torch.Tensor  # [B, max_blocks] int64: each sequence's blocks, padded with 0
    context_lens: torch.Tensor  # [B] int64: each sequence's length, the new token included
    # [B, 1, 1, S] bool, j < that sequence's length; None: all have S, or our kernels run
    mask: torch.Tensor | None


@dataclass(slots=True, frozen=True)
class PrefillChunk:
    """One sequence's chunk of several tokens at `offset` in the layout, after `context_len`
    tokens of the same sequence that are already in the pool. `block_ids` start at the block
    of key `first_key` (0, or on a sliding layer's stock path the chunk's first window)."""

    offset: int
    length: int
    context_len: int
    block_ids: torch.Tensor | None  # [n] int64 covering context and chunk; None if no context
    # [length, context_len + length - first_key] bool, causal from the chunk's start (and
    # within each query's window); None: no context and no window, or our kernels run
    # (they read no mask)
    mask: torch.Tensor | None
    first_key: int = 0


@dataclass(slots=True, frozen=True)
class GroupView:
    """What the layers of one layer group write and read in a step, through the group's block
    tables: where each new token's K/V goes, the decode group and the prefill chunks. A sliding
    group's, on the stock path, has tables cut to the window and masks that end it (our
    kernels take whole tables and the window)."""

    slot_mapping: torch.Tensor  # [T] int64: pool slot of each new token
    decode: DecodeGroup | None
    prefills: list[PrefillChunk]


@dataclass(slots=True, frozen=True)
class AttentionMetadata:
    """Where this step's tokens go and what they see, one view per layer group; built once per
    step, read by every layer. Layout of the step's flat tokens `[T]`: the decode group first,
    then each prefill chunk."""

    groups: list[GroupView]


@dataclass(slots=True, frozen=True)
class LayerAttention:
    """How one layer attends: its query scale, its sliding window (None: every key) and its
    sink logits (`[H]` fp32, or None)."""

    scale: float
    window: int | None = None
    sinks: torch.Tensor | None = None


def paged_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kv: LayerKV,
    meta: AttentionMetadata,
    how: LayerAttention,
    *,
    written: bool = False,
) -> torch.Tensor:
    """Write the step's K/V into the layer's pool (unless the caller has: `written`), then
    attend each query to its sequence's keys as the layer does (`how`).

    q: [T, H, D]; k, v: [T, KVH, D] → [T, H, D], in the layout order.
    """
    view = meta.groups[kv.group]
    if not written:
        write_kv(kv, k, v, view.slot_mapping)
    outs: list[torch.Tensor] = []
    if view.decode is not None:
        outs.append(decode_attention(q[: view.decode.num_tokens], kv, view.decode, how))
    for chunk in view.prefills:
        span = slice(chunk.offset, chunk.offset + chunk.length)
        outs.append(prefill_attention(q[span], k[span], v[span], kv, chunk, how))
    return outs[0] if len(outs) == 1 else torch.cat(outs)


def write_kv(kv: LayerKV, k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor) -> None:
    """k, v: [T, KVH, D] → pool slots `slots` [T], quantized first in an 8-bit pool (by our
    kernel in one pass where there is one)."""
    for cache, scales, x in ((kv.k, kv.k_scales, k), (kv.v, kv.v_scales, v)):
        if scales is not None and kv.kernels is not None and x.dtype == torch.bfloat16:
            kv.kernels.write_kv_int8(x, slots, cache, scales)
            continue
        if scales is not None:
            x, x_scales = quantize_rows(x)
            scales.view(-1, scales.shape[2]).index_copy_(0, slots, x_scales)
        cache.view(-1, *cache.shape[2:]).index_copy_(0, slots, x)


def decode_attention(
    q: torch.Tensor, kv: LayerKV, group: DecodeGroup, how: LayerAttention
) -> torch.Tensor:
    """Single-token queries of B sequences of different lengths: q: [B, H, D] → [B, H, D].

    With our kernels (CPU or Triton), one call reads each sequence's blocks in place. Otherwise
    gather each sequence's blocks into one padded batch, then one SDPA call with a length mask;
    each KV head's G = H / KVH query heads are folded into the query axis ([B, KVH, G, D]), so
    GQA needs no K/V expansion (SDPA's `enable_gqa` would leave the fused CPU kernel for the
    math path).
    On a sliding layer the stock path is handed the window's view (`GroupView`).
    """
    if kv.kernels is not None:
        return kv.kernels.decode_attention(
            q,
            kv.k,
            kv.v,
            group.block_tables,
            group.context_lens,
            how.scale,
            how.window,
            how.sinks,
            kv.k_scales,
            kv.v_scales,
        )
    batch, heads, dim = q.shape
    kv_heads = kv.k.shape[2]
    k, v = kv.gather(group.block_tables.view(-1), batch, q.dtype)
    k, v = k[:, :, : group.num_keys], v[:, :, : group.num_keys]  # [B, KVH, S, D]
    qg = q.view(batch, kv_heads, heads // kv_heads, dim)  # [B, KVH, G, D]
    sinks = None if how.sinks is None else how.sinks.view(1, kv_heads, -1, 1)
    out = _attend(qg, k, v, group.mask, False, how.scale, sinks)
    return out.reshape(batch, heads, dim)  # a CUDA kernel may lay its output out otherwise


def prefill_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kv: LayerKV,
    chunk: PrefillChunk,
    how: LayerAttention,
) -> torch.Tensor:
    """A chunk attends to its sequence's cached context and, causally, to itself.

    q: [n, H, D]; k, v: [n, KVH, D] (the chunk's own, already written) → [n, H, D]. A chunk
    with no context attends to its own K/V directly; otherwise to the pool's blocks (they hold
    the chunk too, written just before). Our CPU kernel reads them in place, the G query heads
    of a KV head from each key load, and skips the masked upper triangle. The stock path
    gathers the blocks and repeats K/V heads for GQA (cheap next to the chunk's matmuls, and it
    keeps SDPA on its fused CPU kernel), but SDPA computes the whole masked rectangle.
    """
    if kv.kernels is not None:
        window, sinks = how.window, how.sinks
        if chunk.block_ids is None:
            return kv.kernels.prefill_attention(q, k, v, None, 0, how.scale, window, sinks)
        return kv.kernels.prefill_attention(
            q,
            kv.k,
            kv.v,
            chunk.block_ids,
            chunk.context_len,
            how.scale,
            window,
            sinks,
            kv.k_scales,
            kv.v_scales,
        )
    heads = q.shape[1]
    qt = q.transpose(0, 1)[None]  # [1, H, n, D]: the fused kernel takes 4-D inputs only
    if chunk.block_ids is None:
        kt, vt = k.transpose(0, 1)[None], v.transpose(0, 1)[None]  # [1, KVH, n, D]
    else:
        keys = chunk.context_len + chunk.length - chunk.first_key
        kt, vt = kv.gather(chunk.block_ids, 1, q.dtype)
        kt, vt = kt[:, :, :keys], vt[:, :, :keys]  # [1, KVH, S, D]
        if chunk.length <= FOLDED_CHUNK_ROWS and how.sinks is None and chunk.mask is not None:
            return _folded_attention(q, kt, vt, chunk.mask, how.scale)
    groups = heads // kt.shape[1]
    kt, vt = kt.repeat_interleave(groups, 1), vt.repeat_interleave(groups, 1)  # [1, H, S, D]
    sinks = None if how.sinks is None else how.sinks.view(1, heads, 1, 1)
    out = _attend(qt, kt, vt, chunk.mask, chunk.mask is None, how.scale, sinks)
    return out[0].transpose(0, 1)


# A chunk of at most this many tokens after a long context (a draft's verification, a short
# turn) attends as decodes do, its query heads folded per KV head, instead of repeating K/V for
# every query head: at a few thousand keys the copy cost more than the attention itself.
FOLDED_CHUNK_ROWS = 32


def _folded_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float
) -> torch.Tensor:
    """q: [n, H, D]; k, v: [1, KVH, S, D]; mask: [n, S] → [n, H, D]. Each KV head's G query
    heads times n queries form one query axis ([1, KVH, G · n, D]), each row masked as its
    query is."""
    n, heads, dim = q.shape
    kv_heads = k.shape[1]
    groups = heads // kv_heads
    qg = q.view(n, kv_heads, groups, dim).permute(1, 2, 0, 3).reshape(1, kv_heads, -1, dim)
    out = F.scaled_dot_product_attention(qg, k, v, attn_mask=mask.repeat(groups, 1), scale=scale)
    return out.view(kv_heads, groups, n, dim).permute(2, 0, 1, 3).reshape(n, heads, dim)


def _attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    causal: bool,
    scale: float,
    sinks: torch.Tensor | None,
) -> torch.Tensor:
    """SDPA, or with sink logits (broadcast to [..., q, 1]) the same softmax written out, the
    sinks a last column that is dropped before the values (as transformers computes it).

    q: [..., q, D]; k, v: [..., S, D]; mask: bool, broadcast to [..., q, S]."""
    if sinks is None:
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=causal, scale=scale
        )
    scores = torch.matmul(q, k.transpose(-1, -2)).float() * scale  # [..., q, S]
    if causal:
        mask = torch.ones(scores.shape[-2:], dtype=torch.bool, device=q.device).tril_()
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    with_sinks = torch.cat([scores, sinks.float().expand(*scores.shape[:-1], 1)], -1)
    weights = torch.softmax(with_sinks, dim=-1)[..., :-1]
    return torch.matmul(weights.to(v.dtype), v)
