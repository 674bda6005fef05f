"""Paged attention over scattered pool blocks equals dense causal attention."""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F

from semantic.backends.torch.attention import (
    GatherScratch,
    LayerAttention,
    LayerKV,
    _folded_attention,
    paged_attention,
    write_kv,
)
from semantic.backends.torch.runner import build_step
from semantic.core import Batch, BatchItem, SamplingParams

HEADS, KV_HEADS, DIM = 4, 2, 8
BLOCK_TOKENS = 5  # divides none of the lengths below
NUM_BLOCKS = 64
SCALE = DIM**-0.5
CPU = torch.device("cpu")


class Seq:
    """One sequence's random Q/K/V for every position, and scattered blocks for it."""

    def __init__(self, length: int, blocks: list[int]) -> None:
        self.q = torch.randn(length, HEADS, DIM)
        self.k = torch.randn(length, KV_HEADS, DIM)
        self.v = torch.randn(length, KV_HEADS, DIM)
        self.blocks = blocks

    def slots(self, start: int, end: int) -> torch.Tensor:
        return torch.tensor(
            [
                self.blocks[p // BLOCK_TOKENS] * BLOCK_TOKENS + p % BLOCK_TOKENS
                for p in range(start, end)
            ]
        )


def make_pool(dtype: torch.dtype = torch.float32) -> LayerKV:
    data = torch.zeros(2, 1, NUM_BLOCKS, BLOCK_TOKENS, KV_HEADS, DIM, dtype=dtype)
    return LayerKV(data[0, 0], data[1, 0], GatherScratch(data))


@pytest.fixture
def pool() -> LayerKV:
    return make_pool()


@pytest.fixture
def free_blocks() -> list[int]:
    torch.manual_seed(0)
    blocks = list(range(NUM_BLOCKS))
    random.Random(0).shuffle(blocks)
    return blocks


def new_seq(length: int, free: list[int]) -> Seq:
    count = -(-length // BLOCK_TOKENS)
    blocks = [free.pop() for _ in range(count)]
    return Seq(length, blocks)


def dense(seq: Seq, start: int, end: int) -> torch.Tensor:
    """Reference: queries start..end-1 over keys 0..end-1, causal, GQA by repetition."""
    group = HEADS // KV_HEADS
    k = seq.k[:end].repeat_interleave(group, 1)  # [S, H, D]
    v = seq.v[:end].repeat_interleave(group, 1)
    scores = torch.einsum("qhd,khd->hqk", seq.q[start:end], k) * SCALE
    qpos = torch.arange(start, end)[:, None]
    scores = scores.masked_fill(torch.arange(end)[None, :] > qpos, float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)


def item(seq: Seq, start: int, end: int) -> BatchItem:
    return BatchItem(0, [1] * (end - start), start, [seq.blocks], True, SamplingParams(), 0)


def run_step(pool: LayerKV, parts: list[tuple[Seq, int, int]]) -> torch.Tensor:
    """Write each sequence's context [0, start) into the pool, then run one step over the parts
    (decodes must come first, as the layout puts them) and return [T, H, D]."""
    for seq, start, _ in parts:
        if start:
            write_kv(pool, seq.k[:start], seq.v[:start], seq.slots(0, start))
    step = build_step(Batch([item(s, a, b) for s, a, b in parts]), BLOCK_TOKENS, CPU)
    q = torch.cat([s.q[a:b] for s, a, b in parts])
    k = torch.cat([s.k[a:b] for s, a, b in parts])
    v = torch.cat([s.v[a:b] for s, a, b in parts])
    return paged_attention(q, k, v, pool, step.meta, LayerAttention(SCALE))


def split(out: torch.Tensor, parts: list[tuple[Seq, int, int]]) -> list[torch.Tensor]:
    return list(out.split([b - a for _, a, b in parts]))


@pytest.mark.parametrize(("start", "end"), [(0, 13), (7, 19), (10, 11), (4, 5), (5, 23)])
def test_prefill_chunk_with_context_equals_dense_causal(pool, free_blocks, start, end):
    seq = new_seq(end, free_blocks)
    out = run_step(pool, [(seq, start, end)])
    torch.testing.assert_close(out, dense(seq, start, end), atol=1e-5, rtol=1e-5)


def test_batched_decodes_of_different_lengths_equal_dense(pool, free_blocks):
    lengths = [1, 4, 5, 6, 17, 31]
    seqs = [new_seq(n, free_blocks) for n in lengths]
    parts = [(s, n - 1, n) for s, n in zip(seqs, lengths, strict=True)]
    outs = split(run_step(pool, parts), parts)
    for (seq, start, end), out in zip(parts, outs, strict=True):
        torch.testing.assert_close(out, dense(seq, start, end), atol=1e-5, rtol=1e-5)


def test_mixed_step_of_decodes_and_chunks_equals_dense(pool, free_blocks):
    a, b, c, d = (new_seq(n, free_blocks) for n in (9, 22, 14, 12))
    parts = [(a, 8, 9), (b, 21, 22), (c, 0, 14), (d, 3, 12)]
    outs = split(run_step(pool, parts), parts)
    for (seq, start, end), out in zip(parts, outs, strict=True):
        torch.testing.assert_close(out, dense(seq, start, end), atol=1e-5, rtol=1e-5)


def test_step_writes_new_kv_into_the_slots_of_its_positions(pool, free_blocks):
    seq = new_seq(12, free_blocks)
    run_step(pool, [(seq, 3, 12)])
    slots = seq.slots(3, 12)
    torch.testing.assert_close(pool.k.flatten(0, 1)[slots], seq.k[3:12])
    torch.testing.assert_close(pool.v.flatten(0, 1)[slots], seq.v[3:12])


def test_bf16_pool_matches_dense_within_bf16_tolerance(free_blocks):
    pool = make_pool(torch.bfloat16)
    seqs = [new_seq(n, free_blocks) for n in (7, 16)]
    for s in seqs:
        s.q, s.k, s.v = s.q.bfloat16(), s.k.bfloat16(), s.v.bfloat16()
    parts = [(seqs[0], 6, 7), (seqs[1], 2, 16)]
    outs = split(run_step(pool, parts), parts)
    for (seq, start, end), out in zip(parts, outs, strict=True):
        ref = _dense_fp32(seq, start, end)
        torch.testing.assert_close(out.float(), ref, atol=2e-2, rtol=2e-2)


def _dense_fp32(seq: Seq, start: int, end: int) -> torch.Tensor:
    ref = Seq.__new__(Seq)
    ref.q, ref.k, ref.v, ref.blocks = seq.q.float(), seq.k.float(), seq.v.float(), seq.blocks
    return dense(ref, start, end)


def windowed_dense(
    seq: Seq, start: int, end: int, window: int, sinks: torch.Tensor
) -> torch.Tensor:
    """Reference for a sliding layer with sinks: each query over its last `window` keys, a
    head's sink logit joining the softmax with no value."""
    group = HEADS // KV_HEADS
    k = seq.k[:end].repeat_interleave(group, 1)  # [S, H, D]
    v = seq.v[:end].repeat_interleave(group, 1)
    scores = torch.einsum("qhd,khd->hqk", seq.q[start:end], k) * SCALE
    query, key = torch.arange(start, end)[:, None], torch.arange(end)[None, :]
    scores = scores.masked_fill((key > query) | (key <= query - window), float("-inf"))
    scores = torch.cat([scores, sinks.view(HEADS, 1, 1).expand(HEADS, end - start, 1)], -1)
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1)[..., :end], v)


@pytest.mark.parametrize("window", [1, 4, 7, 12, 40])
def test_stock_path_reads_a_sliding_layer_window_only(pool, free_blocks, window):
    """Decodes and chunks, with context and without, of a sliding layer with sinks: equal to
    the dense reference, and the blocks wholly before each query's window are never read."""
    sinks = torch.randn(HEADS)
    a, b, c, d, e = (new_seq(n, free_blocks) for n in (9, 22, 14, 12, 30))
    parts = [(a, 8, 9), (b, 21, 22), (c, 0, 14), (d, 3, 12), (e, 13, 30)]
    for seq, start, _ in parts:
        if start:
            write_kv(pool, seq.k[:start], seq.v[:start], seq.slots(0, start))
            first_block = max(0, start - window + 1) // BLOCK_TOKENS
            for block in seq.blocks[:first_block]:
                pool.k[block], pool.v[block] = float("nan"), float("nan")
    batch = Batch([item(s, lo, hi) for s, lo, hi in parts])
    step = build_step(batch, BLOCK_TOKENS, CPU, group_windows=[window])
    q, k, v = (torch.cat([getattr(s, name)[lo:hi] for s, lo, hi in parts]) for name in "qkv")
    out = paged_attention(q, k, v, pool, step.meta, LayerAttention(SCALE, window, sinks))
    for (seq, start, end), got in zip(parts, split(out, parts), strict=True):
        expected = windowed_dense(seq, start, end, window, sinks)
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_a_short_chunk_folds_its_query_heads_and_attends_as_with_repeated_kv() -> None:
    torch.manual_seed(0)
    n, heads, kv_heads, dim, keys = 5, 9, 3, 16, 300
    q = torch.randn(n, heads, dim)
    k, v = torch.randn(1, kv_heads, keys, dim), torch.randn(1, kv_heads, keys, dim)
    mask = torch.ones(n, keys, dtype=torch.bool).tril_(keys - n)
    mask[:, :40] = False  # a sliding window's first keys
    repeated = F.scaled_dot_product_attention(
        q.transpose(0, 1)[None],
        k.repeat_interleave(3, 1),
        v.repeat_interleave(3, 1),
        attn_mask=mask,
        scale=0.25,
    )
    expected = repeated[0].transpose(0, 1)
    torch.testing.assert_close(_folded_attention(q, k, v, mask, 0.25), expected)
