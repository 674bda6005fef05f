"""Paged attention on CUDA: Triton kernels that read each sequence's KV blocks in place through
its block table, for decode (one query per sequence) and for prefill chunks (causal over the
sequence's cached context and the chunk itself). `TritonAttention` offers the CPU kernels'
entry points (`kernels.CpuKernels`) with their semantics, so `attention.KVPool` holds either.

Both kernels put all G = H / KVH query heads of a KV head into one program, so each key and
value row is loaded once per KV head, never once per query head (decode pads the G heads to 16
rows, tl.dot's smallest). Key tiles start at multiples of the tile size; where blocks are a
power of two of at least 16 tokens (the default is 256) a tile lies in one page: one table entry
per tile, and its rows are fixed offsets from one base pointer. Other block sizes look up each
key's page (`BY_TOKEN`), so any block size works. Scores run in the log2 domain (the scale
folds in log2 e, softmax uses exp2); the online softmax keeps a running max, sum and fp32
accumulator per query row. Sinks (a logit per head with no value) are the initial state of
that softmax: max = the sink, sum = 1, nothing accumulated, so they need no pass of their own.
Sliding windows start the key loop at the tile holding the window's first key, and no key
before it is loaded (a sliding layer gives back the blocks its window has left, and its table
names page 0 there). 8-bit pools load int8 rows and their bf16 row scales, passed as int16 bits
and widened in registers (`bits << 16` bitcast to fp32: the interpreter has no bf16, and it is
one shift on a GPU): a key's scale multiplies its score, a value's its probability.

Decode is flash-decoding: a grid of (sequence, KV head, split), each split a contiguous span of
the keys the query sees (from its window's first tile, or 0), then a second kernel merges the
splits' (max, sum, accumulator) by logsumexp. The split count comes from shapes only -- the
batch, the KV heads, the block table's width and the window -- never from values, so a decode
step is CUDA-graph safe: no host sync, and every allocation and grid is fixed by the bucket's
shapes. The rule: enough splits that programs cover the GPU's SMs about twice, but none shorter
than 256 keys (below that the merge costs more than the parallelism gains), at most 16; a split
that holds no key of a short sequence exits at once. A graph bucket's padding rows (context 1,
a table of zeros) read slot 0 of page 0 and write their own output rows only. Key tiles of 64.

Prefill tiles the chunk's (query, head-in-group) rows, 64 a tile (32 or 16 where a short chunk
would leave SMs idle), against key tiles of 64 (32 at head_dim 256, to keep the accumulator in
registers; 8 warps for 64 rows of 256 bytes, where 4 would spill). A tile's key loop ends at its
last query's position and starts at its first query's window, so key tiles wholly above the
causal diagonal or before every row's window are skipped; only tiles that cross them are masked.

Tile sizes, warps and the split rule are first choices from the usual flash-attention /
flash-decoding designs. THEY ARE YET TO BE MEASURED ON A GPU (`benchmarks/cuda_attention.py`).
Correctness is proven on the CPU under Triton's interpreter (fp32 and fp16: the interpreter has
no bf16), and every kind of launch is compiled for sm_90 without a GPU by the tests
(`tests/unit/triton_compile.py`: registers per thread, no spills in 16-bit).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import triton
import triton.language as tl

_LOG2E = 1.4426950408889634
LOG2E = tl.constexpr(_LOG2E)
_MIN_SPLIT_KEYS = 256
_MAX_SPLITS = 16
_MIN_TILE = 16  # tl.dot's smallest operand side on a GPU
_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@triton.jit
def _widen_bf16(bits):  # type: ignore[no-untyped-def]
    """bf16 values passed as their int16 bits → fp32."""
    return (bits.to(tl.int32) << 16).to(tl.float32, bitcast=True)


# How a key tile's rows are addressed (the kernels' KEYS constexpr).
IN_PAGE = tl.constexpr(0)  # the tile lies in one page: one table entry, rows at fixed offsets
BY_TOKEN = tl.constexpr(1)  # any block size: each key's page looked up on its own
OWN_ROWS = tl.constexpr(2)  # a chunk's own K/V [n, KVH, D], no table


@triton.jit
def _tile_pointers(  # type: ignore[no-untyped-def]
    k_head,
    v_head,
    ks_head,
    vs_head,
    table_row,
    start,
    valid,
    d,
    stride_kp,
    stride_kt,
    stride_vp,
    stride_vt,
    stride_sp,
    stride_st,
    BLOCK_N: tl.constexpr,
    BLOCK_TOKENS: tl.constexpr,
    KEYS: tl.constexpr,
):
    """Pointers to the keys start .. start + BLOCK_N of one KV head: K as [D, N], V as [N, D],
    their scales as [N]. IN_PAGE and OWN_ROWS add fixed offsets to one scalar base (few
    registers); BY_TOKEN gathers a row pointer per key."""
    n = tl.arange(0, BLOCK_N)
    if KEYS == BY_TOKEN:
        pos = start + n
        page = tl.load(table_row + pos // BLOCK_TOKENS, mask=valid, other=0).to(tl.int64)
        slot = (pos % BLOCK_TOKENS).to(tl.int64)
        k_rows = k_head + page * stride_kp + slot * stride_kt
        v_rows = v_head + page * stride_vp + slot * stride_vt
        scale_rows = page * stride_sp + slot * stride_st
        k_tile = k_rows[None, :] + d[:, None]
        v_tile = v_rows[:, None] + d[None, :]
    else:
        if KEYS == IN_PAGE:
            page = tl.load(table_row + start // BLOCK_TOKENS).to(tl.int64)
            row = start % BLOCK_TOKENS
        else:
            page = 0
            row = start
        k_base = k_head + page * stride_kp + row * stride_kt
        v_base = v_head + page * stride_vp + row * stride_vt
        scale_rows = page * stride_sp + (row + n) * stride_st
        k_tile = k_base + (n[None, :] * stride_kt + d[:, None])
        v_tile = v_base + (n[:, None] * stride_vt + d[None, :])
    return k_tile, v_tile, scale_rows


@triton.jit
def _attend_tile(  # type: ignore[no-untyped-def]
    q,
    m,
    denom,
    acc,
    visible,
    k_tile,
    v_tile,
    ks_head,
    vs_head,
    scale_rows,
    valid,
    d_valid,
    qk_scale,
    QUANT: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """One key tile of the online softmax: q [rows, D] against K at `k_tile` [D, N] and V at
    `v_tile` [N, D]; `visible` [rows, N] says which keys each row sees. Returns the new
    (max, sum, accumulator)."""
    kt = tl.load(k_tile, mask=valid[None, :] & d_valid[:, None], other=0)
    if QUANT:
        kt = kt.to(q.dtype)
    s = tl.dot(q, kt, input_precision=PRECISION) * qk_scale  # [rows, N] fp32, log2 units
    if QUANT:
        s = s * _widen_bf16(tl.load(ks_head + scale_rows, mask=valid, other=0))[None, :]
    s = tl.where(visible, s, float("-inf"))
    m_new = tl.maximum(m, tl.max(s, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row that sees nothing yet
    alpha = tl.math.exp2(m - m_safe)
    p = tl.math.exp2(s - m_safe[:, None])
    denom = denom * alpha + tl.sum(p, 1)
    v = tl.load(v_tile, mask=valid[:, None] & d_valid[None, :], other=0)
    if QUANT:
        p = p * _widen_bf16(tl.load(vs_head + scale_rows, mask=valid, other=0))[None, :]
        v = v.to(q.dtype)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
    return m_new, denom, acc


@triton.jit
def _initial_state(sinks_ptr, heads, row_valid, use_sinks, HAS_SINKS: tl.constexpr):  # type: ignore[no-untyped-def]
    """(max, sum) before any key: a head's sink logit as if it were a key with no value."""
    if HAS_SINKS:
        sink = tl.load(sinks_ptr + heads, mask=row_valid, other=0.0).to(tl.float32) * LOG2E
        with_sink = row_valid & use_sinks
        return tl.where(with_sink, sink, float("-inf")), tl.where(with_sink, 1.0, 0.0)
    zeros = tl.zeros(heads.shape, tl.float32)
    return zeros + float("-inf"), zeros


@triton.jit(do_not_specialize=["window", "span"])
def _decode_kernel(  # type: ignore[no-untyped-def]
    q_ptr,
    k_ptr,
    v_ptr,
    ks_ptr,
    vs_ptr,
    table_ptr,
    lens_ptr,
    sinks_ptr,
    m_ptr,
    denom_ptr,
    acc_ptr,
    out_ptr,
    qk_scale,
    window,
    span,
    stride_qb,
    stride_qh,
    stride_kp,
    stride_kt,
    stride_kh,
    stride_vp,
    stride_vt,
    stride_vh,
    stride_sp,
    stride_st,
    stride_sh,
    stride_tb,
    stride_ob,
    stride_oh,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_TOKENS: tl.constexpr,
    KEYS: tl.constexpr,
    SPLITS: tl.constexpr,
    HAS_WINDOW: tl.constexpr,
    HAS_SINKS: tl.constexpr,
    QUANT: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """One (sequence, KV head, split): the G query heads over the split's span of keys."""
    b = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    context = tl.load(lens_ptr + b).to(tl.int32)
    first = 0
    if HAS_WINDOW:
        first = tl.maximum(context - window, 0)
    lo = first // BLOCK_N * BLOCK_N + split * span  # tiles aligned to BLOCK_N, as pages are
    hi = tl.minimum(lo + span, context)
    g = tl.arange(0, BLOCK_H)
    row_valid = g < GROUP
    heads = kv_head * GROUP + g
    d = tl.arange(0, BLOCK_D)
    d_valid = d < HEAD_DIM
    q_rows = q_ptr + b.to(tl.int64) * stride_qb + heads * stride_qh
    q = tl.load(q_rows[:, None] + d[None, :], mask=row_valid[:, None] & d_valid[None, :], other=0)
    m, denom = _initial_state(sinks_ptr, heads, row_valid, split == 0, HAS_SINKS)
    acc = tl.zeros((BLOCK_H, BLOCK_D), tl.float32)
    table_row = table_ptr + b.to(tl.int64) * stride_tb
    k_head, v_head = k_ptr + kv_head * stride_kh, v_ptr + kv_head * stride_vh
    ks_head, vs_head = ks_ptr + kv_head * stride_sh, vs_ptr + kv_head * stride_sh
    for start in range(lo, hi, BLOCK_N):
        pos = start + tl.arange(0, BLOCK_N)
        valid = (pos >= first) & (pos < hi)
        k_tile, v_tile, scale_rows = _tile_pointers(
            k_head, v_head, ks_head, vs_head, table_row, start, valid, d,
            stride_kp, stride_kt, stride_vp, stride_vt, stride_sp, stride_st,
            BLOCK_N, BLOCK_TOKENS, KEYS,
        )  # fmt: skip
        m, denom, acc = _attend_tile(
            q, m, denom, acc, valid[None, :], k_tile, v_tile, ks_head, vs_head, scale_rows,
            valid, d_valid, qk_scale, QUANT, PRECISION,
        )  # fmt: skip
    if SPLITS == 1:
        out = acc / tl.where(denom > 0, denom, 1.0)[:, None]
        out_rows = out_ptr + b.to(tl.int64) * stride_ob + heads * stride_oh
        mask = row_valid[:, None] & d_valid[None, :]
        tl.store(out_rows[:, None] + d[None, :], out.to(out_ptr.dtype.element_ty), mask=mask)
    else:
        part = (b.to(tl.int64) * GROUP * tl.num_programs(1) + heads) * SPLITS + split
        tl.store(m_ptr + part, m, mask=row_valid)
        tl.store(denom_ptr + part, denom, mask=row_valid)
        acc_rows = acc_ptr + part * BLOCK_D
        tl.store(acc_rows[:, None] + d[None, :], acc, mask=row_valid[:, None])


@triton.jit
def _merge_splits_kernel(  # type: ignore[no-untyped-def]
    m_ptr,
    denom_ptr,
    acc_ptr,
    out_ptr,
    stride_ob,
    stride_oh,
    HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    SPLITS: tl.constexpr,
    BLOCK_S: tl.constexpr,
):
    """One (sequence, query head): its splits' partial softmaxes merged by logsumexp."""
    b = tl.program_id(0)
    head = tl.program_id(1)
    s = tl.arange(0, BLOCK_S)
    s_valid = s < SPLITS
    part = (b.to(tl.int64) * HEADS + head) * SPLITS + s
    m = tl.load(m_ptr + part, mask=s_valid, other=float("-inf"))
    denom = tl.load(denom_ptr + part, mask=s_valid, other=0.0)
    d = tl.arange(0, BLOCK_D)
    acc = tl.load(acc_ptr + part[:, None] * BLOCK_D + d[None, :], mask=s_valid[:, None], other=0)
    top = tl.max(m, 0)
    weight = tl.math.exp2(m - tl.where(top == float("-inf"), 0.0, top))
    total = tl.sum(weight * denom, 0)
    out = tl.sum(weight[:, None] * acc, 0) / tl.where(total > 0, total, 1.0)
    out_row = out_ptr + b.to(tl.int64) * stride_ob + head * stride_oh
    tl.store(out_row + d, out.to(out_ptr.dtype.element_ty), mask=d < HEAD_DIM)


# Values that change from call to call are not specialized on (1, or divisible by 16): each
# would compile a variant of its own, for a second, in the middle of serving.
@triton.jit(do_not_specialize=["window", "context", "n"])
def _prefill_kernel(  # type: ignore[no-untyped-def]
    q_ptr,
    k_ptr,
    v_ptr,
    ks_ptr,
    vs_ptr,
    table_ptr,
    sinks_ptr,
    out_ptr,
    qk_scale,
    window,
    context,
    n,
    stride_qt,
    stride_qh,
    stride_kp,
    stride_kt,
    stride_kh,
    stride_vp,
    stride_vt,
    stride_vh,
    stride_sp,
    stride_st,
    stride_sh,
    stride_ot,
    stride_oh,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_TOKENS: tl.constexpr,
    KEYS: tl.constexpr,
    HAS_WINDOW: tl.constexpr,
    HAS_SINKS: tl.constexpr,
    QUANT: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """One tile of BLOCK_M (query, head-in-group) rows of one KV head over the keys they see."""
    tile = tl.program_id(0)
    kv_head = tl.program_id(1)
    rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    row_valid = rows < n * GROUP
    query = rows // GROUP
    heads = kv_head * GROUP + rows % GROUP
    positions = context + query
    d = tl.arange(0, BLOCK_D)
    d_valid = d < HEAD_DIM
    q_rows = q_ptr + query.to(tl.int64) * stride_qt + heads * stride_qh
    q = tl.load(q_rows[:, None] + d[None, :], mask=row_valid[:, None] & d_valid[None, :], other=0)
    m, denom = _initial_state(sinks_ptr, heads, row_valid, True, HAS_SINKS)
    acc = tl.zeros((BLOCK_M, BLOCK_D), tl.float32)
    first_query = context + (tile * BLOCK_M) // GROUP
    hi = context + tl.minimum((tile * BLOCK_M + BLOCK_M - 1) // GROUP, n - 1) + 1
    lo = 0
    if HAS_WINDOW:
        lo = tl.maximum(first_query - window + 1, 0) // BLOCK_N * BLOCK_N
    k_head, v_head = k_ptr + kv_head * stride_kh, v_ptr + kv_head * stride_vh
    ks_head, vs_head = ks_ptr + kv_head * stride_sh, vs_ptr + kv_head * stride_sh
    for start in range(lo, hi, BLOCK_N):
        pos = start + tl.arange(0, BLOCK_N)
        valid = pos < hi
        if HAS_WINDOW:  # no key before the first row's window is loaded: its page may be gone
            valid = valid & (pos > first_query - window)
        visible = valid[None, :] & (pos[None, :] <= positions[:, None])
        if HAS_WINDOW:
            visible = visible & (pos[None, :] > positions[:, None] - window)
        k_tile, v_tile, scale_rows = _tile_pointers(
            k_head, v_head, ks_head, vs_head, table_ptr, start, valid, d,
            stride_kp, stride_kt, stride_vp, stride_vt, stride_sp, stride_st,
            BLOCK_N, BLOCK_TOKENS, KEYS,
        )  # fmt: skip
        m, denom, acc = _attend_tile(
            q, m, denom, acc, visible, k_tile, v_tile, ks_head, vs_head, scale_rows,
            valid, d_valid, qk_scale, QUANT, PRECISION,
        )  # fmt: skip
    out = acc / tl.where(denom > 0, denom, 1.0)[:, None]
    out_rows = out_ptr + query.to(tl.int64) * stride_ot + heads * stride_oh
    mask = row_valid[:, None] & d_valid[None, :]
    tl.store(out_rows[:, None] + d[None, :], out.to(out_ptr.dtype.element_ty), mask=mask)


class TritonAttention:
    """Paged decode and prefill attention on CUDA tensors (or CPU tensors under Triton's
    interpreter), with `CpuKernels`' signatures and semantics. `sm_count`: the GPU's
    multiprocessors, which the decode split rule fills (the current device's by default).
    `launch` runs each kernel launch an entry point builds (`Launch.run`); a test that compiles
    the launches for a GPU it lacks collects them instead."""

    def __init__(
        self, sm_count: int | None = None, launch: Callable[[Launch], None] | None = None
    ) -> None:
        self.sm_count = sm_count if sm_count is not None else _sm_count()
        self.launch = launch if launch is not None else Launch.run

    def supports_attention(self, head_dim: int, heads: int, dtype: torch.dtype) -> bool:
        """Whether decode and prefill both run these shapes: fp16, bf16 or fp32, head_dim 16 to
        256 (padded to a power of two in registers), any number of heads."""
        return dtype in _DTYPES and 16 <= head_dim <= 256 and heads >= 1

    def decode_splits(self, batch: int, kv_heads: int, keys: int) -> int:
        """How many spans a decode splits each sequence's keys into: enough programs to cover
        the SMs twice, none under `_MIN_SPLIT_KEYS` keys, at most `_MAX_SPLITS`. `keys`: the
        most any sequence can see (the table's width in tokens, or the window)."""
        by_length = triton.cdiv(keys, _MIN_SPLIT_KEYS)
        by_occupancy = triton.cdiv(2 * self.sm_count, max(1, batch * kv_heads))
        return max(1, min(by_length, by_occupancy, _MAX_SPLITS))

    def prefill_tiles(self, rows: int, kv_heads: int, dim: int, dtype: torch.dtype) -> PrefillTiles:
        """Tiles for a chunk of `rows` (query, head) rows per KV head: 64 rows, or 32 or 16
        while fewer programs than SMs would run (a short chunk after a long context); keys in
        tiles of 64, 32 at head_dim 256 to fit the fp32 accumulator; 8 warps for 64 rows of 256
        bytes and more, where 4 spill registers (as compiled for sm_90)."""
        tile_rows = 64
        while tile_rows > _MIN_TILE and triton.cdiv(rows, tile_rows) * kv_heads < self.sm_count:
            tile_rows //= 2
        warps = 8 if tile_rows == 64 and dim * dtype.itemsize >= 256 else 4
        return PrefillTiles(tile_rows, 32 if dim > 128 else 64, warps)

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
    ) -> torch.Tensor:
        """q: [B, H, D]; caches [num_blocks, block_tokens, KVH, D]; block_tables [B, max_blocks];
        context_lens [B] → [B, H, D]: each query over its first context_lens keys, or only the
        last `window` of them; `sinks` [H] fp32: a logit per head with no value. int8 caches
        come with their rows' scales, `k_scales` and `v_scales` [num_blocks, block_tokens, KVH]
        bf16. Launches depend on shapes only (CUDA-graph safe); tables are trusted."""
        batch, heads, dim = q.shape
        kv_heads, block_tokens = k_cache.shape[2], k_cache.shape[1]
        group = heads // kv_heads
        out = q.new_empty(q.shape)
        if batch == 0:
            return out
        q = _last_dim_contiguous(q)
        block_n, key_mode = _key_tiles(_DECODE_KEYS, block_tokens)
        keys = block_tables.shape[1] * block_tokens
        reach = min(keys, window + block_n if window else keys)  # a window starts mid tile
        splits = self.decode_splits(batch, kv_heads, reach)
        span = triton.cdiv(triton.cdiv(reach, splits), block_n) * block_n
        block_d = _block_dim(dim)
        partial_shape = (batch, heads, splits) if splits > 1 else (1, 1, 1)
        m = torch.empty(partial_shape, dtype=torch.float32, device=q.device)
        denom = torch.empty_like(m)
        acc = torch.empty((*partial_shape, block_d), dtype=torch.float32, device=q.device)
        pool = _PoolArgs(k_cache, v_cache, k_scales, v_scales)
        args = (
            q, pool.k, pool.v, pool.k_scales, pool.v_scales, block_tables, context_lens,
            _sinks(sinks, q), m, denom, acc, out, scale * _LOG2E, window or 0, span,
            q.stride(0), q.stride(1), *pool.strides(), block_tables.stride(0),
            out.stride(0), out.stride(1),
        )  # fmt: skip
        constants = {
            "GROUP": group, "HEAD_DIM": dim,
            "BLOCK_H": max(_MIN_TILE, triton.next_power_of_2(group)), "BLOCK_N": block_n,
            "BLOCK_D": block_d, "BLOCK_TOKENS": block_tokens, "KEYS": key_mode,
            "SPLITS": splits, "HAS_WINDOW": window is not None, "HAS_SINKS": sinks is not None,
            "QUANT": pool.quantized, "PRECISION": _precision(q.dtype),
        }  # fmt: skip
        self.launch(Launch(_decode_kernel, (batch, kv_heads, splits), args, constants))
        if splits > 1:
            merge_args = (m, denom, acc, out, out.stride(0), out.stride(1))
            merge_constants = {
                "HEADS": heads, "HEAD_DIM": dim, "BLOCK_D": block_d, "SPLITS": splits,
                "BLOCK_S": triton.next_power_of_2(splits),
            }  # fmt: skip
            self.launch(Launch(_merge_splits_kernel, (batch, heads), merge_args, merge_constants))
        return out

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
    ) -> torch.Tensor:
        """q: [n, H, D] at positions context_len.. → [n, H, D], causal over the sequence's keys
        (with a `window`, the query at p over keys p - window + 1 .. p). k, v: the pool caches
        [num_blocks, block_tokens, KVH, D] read through `block_table` [m]; or, with no context
        and no table, the chunk's own [n, KVH, D]. `sinks` and int8 scales as for decode."""
        n, heads, dim = q.shape
        out = q.new_empty(q.shape)
        if n == 0:
            return out
        q = _last_dim_contiguous(q)
        kv_heads = k.shape[-2]
        tiles = self.prefill_tiles(n * (heads // kv_heads), kv_heads, dim, q.dtype)
        block_n = tiles.keys
        if block_table is None:  # the chunk's own rows: one "page" holding the chunk's tokens
            k, v = k.unsqueeze(0), v.unsqueeze(0)
            key_mode, block_tokens = _OWN_ROWS, 1
        else:
            block_tokens = k.shape[1]
            block_n, key_mode = _key_tiles(block_n, block_tokens)
        group = heads // kv_heads
        pool = _PoolArgs(k, v, k_scales, v_scales)
        table = pool.k if block_table is None else block_table  # a pointer never read
        args = (
            q, pool.k, pool.v, pool.k_scales, pool.v_scales, table, _sinks(sinks, q), out,
            scale * _LOG2E, window or 0, context_len, n,
            q.stride(0), q.stride(1), *pool.strides(), out.stride(0), out.stride(1),
        )  # fmt: skip
        constants = {
            "GROUP": group, "HEAD_DIM": dim, "BLOCK_M": tiles.rows, "BLOCK_N": block_n,
            "BLOCK_D": _block_dim(dim), "BLOCK_TOKENS": block_tokens, "KEYS": key_mode,
            "HAS_WINDOW": window is not None, "HAS_SINKS": sinks is not None,
            "QUANT": pool.quantized, "PRECISION": _precision(q.dtype),
        }  # fmt: skip
        grid = (triton.cdiv(n * group, tiles.rows), kv_heads)
        self.launch(Launch(_prefill_kernel, grid, args, constants, tiles.warps))
        return out


@dataclass(frozen=True, slots=True)
class Launch:
    """One kernel launch: the kernel, its grid, runtime arguments, constexprs and warps. Built
    apart from running it, so a test can compile the very same launch for a GPU it lacks."""

    kernel: Any
    grid: tuple[int, ...]
    args: tuple[Any, ...]
    constants: dict[str, Any]
    num_warps: int = 4

    def run(self) -> None:
        self.kernel[self.grid](*self.args, **self.constants, num_warps=self.num_warps)


_DECODE_KEYS = 64  # keys per decode tile
_IN_PAGE, _BY_TOKEN, _OWN_ROWS = 0, 1, 2  # the kernels' KEYS: IN_PAGE, BY_TOKEN, OWN_ROWS


def _key_tiles(block_n: int, block_tokens: int) -> tuple[int, int]:
    """(keys per tile, how they are addressed) in a pool of `block_tokens` blocks: tiles that
    lie in one page where blocks are a power of two of at least 16 tokens (cut to the block
    where blocks are smaller than `block_n`), else a page lookup per key."""
    if block_tokens >= _MIN_TILE and block_tokens & (block_tokens - 1) == 0:
        return min(block_n, block_tokens), _IN_PAGE
    return block_n, _BY_TOKEN


@dataclass(frozen=True, slots=True)
class PrefillTiles:
    """A prefill launch's tile shape and warps."""

    rows: int  # (query, head) rows per tile
    keys: int  # keys per tile, before a smaller block cuts it
    warps: int


def _block_dim(dim: int) -> int:
    return max(_MIN_TILE, triton.next_power_of_2(dim))


def _precision(dtype: torch.dtype) -> str:
    """fp32 products in full precision (TF32 would miss fp32's tolerance); 16-bit: the default."""
    return "ieee" if dtype == torch.float32 else "tf32"


def _last_dim_contiguous(x: torch.Tensor) -> torch.Tensor:
    """The kernels index rows by strides but read each row's head_dim values as contiguous."""
    return x if x.stride(-1) == 1 else x.contiguous()


def _sinks(sinks: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    """The sink logits, or any tensor as a pointer that is never read."""
    return like if sinks is None else sinks


class _PoolArgs:
    """A layer's K/V (and 8-bit scales) as the kernels take them: last dim contiguous, bf16
    scales as their int16 bits (the interpreter has no bf16), and their strides."""

    def __init__(
        self,
        k: torch.Tensor,
        v: torch.Tensor,
        k_scales: torch.Tensor | None,
        v_scales: torch.Tensor | None,
    ) -> None:
        self.k, self.v = _last_dim_contiguous(k), _last_dim_contiguous(v)
        self.quantized = k.dtype == torch.int8
        self.scale_strides: tuple[int, ...] = (0, 0, 0)
        if self.quantized != (k_scales is not None and v_scales is not None):
            raise ValueError("int8 caches need their scales, and only int8 caches have scales")
        if k_scales is None or v_scales is None:
            self.k_scales = self.v_scales = self.k  # never read
            return
        if k_scales.stride() != v_scales.stride():
            raise ValueError("K and V scales must share a layout")
        self.k_scales, self.v_scales = k_scales.view(torch.int16), v_scales.view(torch.int16)
        self.scale_strides = tuple(k_scales.stride())

    def strides(self) -> tuple[int, ...]:
        """K's (page, token, head) strides, V's, and the scales'."""
        return (*self.k.stride()[:3], *self.v.stride()[:3], *self.scale_strides)


@functools.cache
def _sm_count() -> int:
    if not torch.cuda.is_available():
        return 132  # the interpreter: an H100's, so tests split as a GPU would
    return torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
