"""Paged attention on the MLX backend: what a step's attention reads (each token's slot, each
query's keys in the pool, `pool.py`), and attention over them.

Each new token's K/V are written into the pool first (one scatter per layer), then every query
reads its keys back from the pool through its block tables: a gather of the rows it sees, then
MLX's fused attention (`mx.fast.scaled_dot_product_attention`, which groups query heads over
their KV head itself and takes sinks). Decodes go as one batch, padded to the longest and
masked; each prefill chunk with context, or with keys past its window, reads its own rows
under a causal, windowed mask; a first chunk inside its window attends to its own K/V under
MLX's causal mask, with no gather. Sliding layers gather only their window.

The gather copies each sequence's keys on every step, as the torch backend's stock path does;
a Metal kernel reading the blocks in place (`mx.fast.metal_kernel`) is the way past it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from semantic.backends.mlx.pool import KVPool
from semantic.core import Batch, BatchItem, CacheSpec


@dataclass(slots=True, frozen=True)
class LayerAttention:
    """How one layer attends: its scale, its sliding window (None: every key) and its sinks
    (a logit per query head that joins the softmax with no value; GPT-OSS), `[H]`."""

    scale: float
    window: int | None = None
    sinks: mx.array | None = None


@dataclass(slots=True, frozen=True)
class DecodeReads:
    """The step's decodes (rows 0..B-1 of its tokens) as one group reads them: each one's keys'
    pool rows, padded to the longest, and which of them are real."""

    rows: mx.array  # [B, S] int32
    mask: mx.array | None  # [B, 1, 1, S] bool; None: no padding


@dataclass(slots=True, frozen=True)
class ChunkReads:
    """One prefill chunk (tokens `offset .. offset + length` of the step) as one group reads it:
    its keys' pool rows and the mask over them, or None and None when it attends to its own
    K/V alone, causally."""

    offset: int
    length: int
    rows: mx.array | None  # [K] int32
    mask: mx.array | None  # [length, K] bool


@dataclass(slots=True, frozen=True)
class GroupReads:
    """What one layer group reads and writes in a step: each token's pool row, its decodes'
    keys and its chunks'."""

    slots: mx.array  # [T] int32
    decodes: DecodeReads | None
    chunks: list[ChunkReads]


@dataclass(slots=True, frozen=True)
class StepInputs:
    """One step's tokens, decodes first, then each prefill chunk; each group's reads; the rows
    of the hidden state to sample and which items they are."""

    input_ids: mx.array  # [T] int32
    positions: np.ndarray  # [T] int64, for the rope tables
    groups: list[GroupReads]
    sample_rows: mx.array | None  # [N]; None: every row
    sampled_items: list[BatchItem]
    sampled_index: list[int]


def build_step(batch: Batch, spec: CacheSpec) -> StepInputs:
    """The step's flat tokens and what each layer group reads, from the batch's lists."""
    items = batch.items
    decodes = [i for i, item in enumerate(items) if len(item.token_ids) == 1]
    chunks = [i for i, item in enumerate(items) if len(item.token_ids) > 1]
    order = decodes + chunks
    ids = [token for i in order for token in items[i].token_ids]
    positions = np.concatenate(
        [np.arange(items[i].start_pos, items[i].start_pos + len(items[i].token_ids)) for i in order]
        or [np.zeros(0, np.int64)]
    )
    ends = np.cumsum([len(items[i].token_ids) for i in order], dtype=np.int64) - 1
    groups = [
        _group_reads([items[i] for i in decodes], [items[i] for i in chunks], g, window, spec)
        for g, window in enumerate(spec.group_windows)
    ]
    sampled = [(int(end), i) for end, i in zip(ends, order, strict=True) if items[i].sample]
    rows = [end for end, _ in sampled]
    return StepInputs(
        input_ids=mx.array(ids, dtype=mx.int32),
        positions=positions,
        groups=groups,
        sample_rows=None if rows == list(range(len(ids))) else mx.array(rows, dtype=mx.int32),
        sampled_items=[items[i] for _, i in sampled],
        sampled_index=[i for _, i in sampled],
    )


def _group_reads(
    decodes: list[BatchItem],
    chunks: list[BatchItem],
    group: int,
    window: int | None,
    spec: CacheSpec,
) -> GroupReads:
    bt = spec.block_tokens
    slots = [
        _pool_rows(
            item.block_tables[group], item.start_pos, item.start_pos + len(item.token_ids), bt
        )
        for item in decodes + chunks
    ]
    offset = len(decodes)
    chunk_reads = []
    for item in chunks:
        chunk_reads.append(_chunk_reads(item, offset, group, window, bt))
        offset += len(item.token_ids)
    return GroupReads(
        slots=mx.array(np.concatenate(slots) if slots else np.zeros(0, np.int32)),
        decodes=_decode_reads(decodes, group, window, bt) if decodes else None,
        chunks=chunk_reads,
    )


def _decode_reads(items: list[BatchItem], group: int, window: int | None, bt: int) -> DecodeReads:
    spans = [_key_span(item.start_pos, item.start_pos + 1, window) for item in items]
    width = max(hi - lo for lo, hi in spans)
    rows = np.zeros((len(items), width), np.int32)  # padding reads row 0, masked
    mask = np.zeros((len(items), width), np.bool_)
    for b, (item, (lo, hi)) in enumerate(zip(items, spans, strict=True)):
        rows[b, : hi - lo] = _pool_rows(item.block_tables[group], lo, hi, bt)
        mask[b, : hi - lo] = True
    padded = not bool(mask.all())
    return DecodeReads(mx.array(rows), mx.array(mask[:, None, None]) if padded else None)


def _chunk_reads(
    item: BatchItem, offset: int, group: int, window: int | None, bt: int
) -> ChunkReads:
    start, length = item.start_pos, len(item.token_ids)
    if start == 0 and (window is None or length <= window):
        return ChunkReads(offset, length, None, None)
    lo, hi = _key_span(start, start + length, window)
    queries = np.arange(start, start + length)[:, None]
    keys = np.arange(lo, hi)[None]
    mask = keys <= queries
    if window is not None:
        mask &= keys > queries - window
    rows = _pool_rows(item.block_tables[group], lo, hi, bt)
    return ChunkReads(offset, length, mx.array(rows), mx.array(mask))


def _key_span(first_query: int, end: int, window: int | None) -> tuple[int, int]:
    """The positions [lo, hi) of the keys that queries `first_query .. end - 1` see."""
    return (0 if window is None else max(0, first_query - window + 1)), end


def _pool_rows(table: Sequence[int], lo: int, hi: int, bt: int) -> np.ndarray:
    """The pool rows of positions [lo, hi) of a sequence with block table `table`."""
    blocks = np.asarray(table[lo // bt : -(-hi // bt)], dtype=np.int32)
    rows = (blocks[:, None] * bt + np.arange(bt, dtype=np.int32)).ravel()
    return rows[lo % bt : lo % bt + hi - lo]


def paged_attention(
    q: mx.array,
    k: mx.array,
    v: mx.array,
    pool: KVPool,
    i: int,
    reads: GroupReads,
    how: LayerAttention,
) -> mx.array:
    """q: [T, H, D], k, v: [T, KVH, D], the step's tokens → [T, H, D]. Writes k and v into
    the pool's i-th arrays (the layer's place in its group), then attends: decodes over their
    gathered keys, chunks over theirs."""
    pool.write(i, reads.slots, k, v)
    outs = []
    if reads.decodes is not None:
        outs.append(_decode(q[: reads.decodes.rows.shape[0]], pool, i, reads.decodes, how))
    for chunk in reads.chunks:
        end = chunk.offset + chunk.length
        outs.append(
            _chunk(
                q[chunk.offset : end],
                k[chunk.offset : end],
                v[chunk.offset : end],
                pool,
                i,
                chunk,
                how,
            )
        )
    return mx.concatenate(outs) if len(outs) != 1 else outs[0]


def _decode(q: mx.array, pool: KVPool, i: int, reads: DecodeReads, how: LayerAttention) -> mx.array:
    # q: [B, H, D] → [B, H, D]; keys [B, S, KVH, D] → [B, KVH, S, D]
    keys, values = (x.transpose(0, 2, 1, 3) for x in pool.gather(i, reads.rows))
    out = _attend(q[:, :, None], keys, values, reads.mask, how)  # [B, H, 1, D]
    return out[:, :, 0]


def _chunk(
    q: mx.array,
    k: mx.array,
    v: mx.array,
    pool: KVPool,
    i: int,
    chunk: ChunkReads,
    how: LayerAttention,
) -> mx.array:
    # q: [n, H, D] → [n, H, D]
    mask: mx.array | str | None
    if chunk.rows is None:
        keys, values, mask = k, v, "causal"
    else:
        (keys, values), mask = pool.gather(i, chunk.rows), chunk.mask
    out = _attend(
        q.transpose(1, 0, 2)[None],
        keys.transpose(1, 0, 2)[None],
        values.transpose(1, 0, 2)[None],
        mask,
        how,
    )  # [1, H, n, D]
    return out[0].transpose(1, 0, 2)


def _attend(
    q: mx.array, k: mx.array, v: mx.array, mask: mx.array | str | None, how: LayerAttention
) -> mx.array:
    return mx.fast.scaled_dot_product_attention(
        q, k, v, scale=how.scale, mask=mask, sinks=how.sinks
    )
