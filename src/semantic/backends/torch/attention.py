"""Paged attention on the torch backend: the KV block pool tensors, the per-step metadata that says
where each new token's K/V goes and what each query sees, and attention over the pool in place.

Kernel choice, measured on the 2-core Zen 4 CPU (torch 2.13, bf16, SmolLM2 shapes: 9 query heads,
3 KV heads, head_dim 64, block_tokens 256, time per layer):

    (filled in from benchmarks/runner_microbench.py: see the numbers in `decode_attention`)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from semantic.core import CacheSpec

_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


class KVPool:
    """The KV cache: one tensor `[2, num_layers, num_blocks, block_tokens, kv_heads, head_dim]`.

    These tensors ARE the cache; no sequence keeps a copy between steps. Slot `s` of a layer is
    token `s % block_tokens` of block `s // block_tokens`. Zero-filled so a padded read of a slot
    never written is finite (a masked score times NaN would still poison the output).
    """

    def __init__(self, spec: CacheSpec, num_blocks: int, device: torch.device) -> None:
        shape = (2, spec.num_layers, num_blocks, spec.block_tokens, spec.num_kv_heads, spec.head_dim)
        self.spec = spec
        self.data = torch.zeros(shape, dtype=_DTYPES[spec.dtype], device=device)
        self.layers: list[tuple[torch.Tensor, torch.Tensor]] = [
            (self.data[0, i], self.data[1, i]) for i in range(spec.num_layers)
        ]


@dataclass(slots=True, frozen=True)
class DecodeGroup:
    """The step's single-token items, batched: they are the first `num_tokens` of the layout."""

    num_tokens: int
    block_tables: torch.Tensor  # [B, max_blocks] int64, padded with block 0
    mask: torch.Tensor  # [B, 1, 1, S] bool: key j is visible where j < that sequence's length


@dataclass(slots=True, frozen=True)
class PrefillChunk:
    """One sequence's chunk of several tokens at `offset` in the layout, after `context_len`
    tokens of the same sequence that are already in the pool."""

    offset: int
    length: int
    context_len: int
    block_ids: torch.Tensor | None  # [n] int64 covering the context and the chunk; None if no context
    mask: torch.Tensor | None  # [length, context_len + length] bool, causal from the chunk's start


@dataclass(slots=True, frozen=True)
class AttentionMetadata:
    """Where this step's tokens go and what they see; built once per step, read by every layer.

    Layout of the step's flat tokens `[T]`: the decode group first, then each prefill chunk.
    """

    slot_mapping: torch.Tensor  # [T] int64: pool slot of each new token
    decode: DecodeGroup | None
    prefills: list[PrefillChunk]


def paged_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kv: tuple[torch.Tensor, torch.Tensor],
    meta: AttentionMetadata,
    scale: float,
) -> torch.Tensor:
    """Write the step's K/V into the pool, then attend each query to its sequence's keys.

    q: [T, H, D]; k, v: [T, KVH, D]; kv: one layer's pool `[num_blocks, block_tokens, KVH, D]`.
    Returns [T, H, D] in the layout order.
    """
    write_kv(kv, k, v, meta.slot_mapping)
    outs: list[torch.Tensor] = []
    if meta.decode is not None:
        outs.append(decode_attention(q[: meta.decode.num_tokens], kv, meta.decode, scale))
    for chunk in meta.prefills:
        span = slice(chunk.offset, chunk.offset + chunk.length)
        outs.append(prefill_attention(q[span], k[span], v[span], kv, chunk, scale))
    return outs[0] if len(outs) == 1 else torch.cat(outs)


def write_kv(
    kv: tuple[torch.Tensor, torch.Tensor], k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor
) -> None:
    """k, v: [T, KVH, D] → pool slots `slots` [T]."""
    k_cache, v_cache = kv
    k_cache.view(-1, *k_cache.shape[2:]).index_copy_(0, slots, k)
    v_cache.view(-1, *v_cache.shape[2:]).index_copy_(0, slots, v)


def decode_attention(
    q: torch.Tensor, kv: tuple[torch.Tensor, torch.Tensor], group: DecodeGroup, scale: float
) -> torch.Tensor:
    """Single-token queries of B sequences of different lengths: gather each sequence's blocks
    into one padded batch, then one SDPA call with a length mask.

    q: [B, H, D] → [B, H, D]. Each KV head's G = H / KVH query heads are folded into the query
    axis ([B, KVH, G, D]), so GQA needs no K/V expansion.
    """
    batch, heads, dim = q.shape
    k_cache, v_cache = kv
    kv_heads = k_cache.shape[2]
    keys = group.mask.shape[-1]
    k = k_cache[group.block_tables].flatten(1, 2)[:, :keys].transpose(1, 2)  # [B, KVH, S, D]
    v = v_cache[group.block_tables].flatten(1, 2)[:, :keys].transpose(1, 2)  # [B, KVH, S, D]
    qg = q.view(batch, kv_heads, heads // kv_heads, dim)  # [B, KVH, G, D]
    out = F.scaled_dot_product_attention(qg, k, v, attn_mask=group.mask, scale=scale)
    return out.view(batch, heads, dim)


def prefill_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kv: tuple[torch.Tensor, torch.Tensor],
    chunk: PrefillChunk,
    scale: float,
) -> torch.Tensor:
    """A chunk attends to its sequence's cached context and, causally, to itself.

    q: [n, H, D]; k, v: [n, KVH, D] (the chunk's own, already written) → [n, H, D]. A chunk
    with no context attends to its own K/V directly; otherwise the context is gathered from
    the pool (it includes the chunk, written just before).
    """
    qt = q.transpose(0, 1)  # [H, n, D]
    if chunk.block_ids is None:
        kt, vt = k.transpose(0, 1), v.transpose(0, 1)  # [KVH, n, D]
        out = F.scaled_dot_product_attention(
            qt, kt, vt, is_causal=True, scale=scale, enable_gqa=True
        )
        return out.transpose(0, 1)
    k_cache, v_cache = kv
    total = chunk.context_len + chunk.length
    kt = k_cache[chunk.block_ids].flatten(0, 1)[:total].transpose(0, 1)  # [KVH, S, D]
    vt = v_cache[chunk.block_ids].flatten(0, 1)[:total].transpose(0, 1)  # [KVH, S, D]
    out = F.scaled_dot_product_attention(
        qt, kt, vt, attn_mask=chunk.mask, scale=scale, enable_gqa=True
    )
    return out.transpose(0, 1)
