"""The CUDA backend's Triton paged attention against attention written out in fp32: decode and
prefill read blocks scattered in the pool in place, with GQA, sliding windows (keys before the
window never read), sinks and 8-bit pools. Without a GPU the kernels run in Triton's
interpreter on CPU tensors (fp32 and fp16: it has no bf16)."""

from __future__ import annotations

import inspect
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import triton

from semantic.backends.torch.attention import (
    DecodeGroup,
    GatherScratch,
    LayerAttention,
    LayerKV,
    PrefillChunk,
    decode_attention,
    prefill_attention,
)
from semantic.backends.torch.cuda.attention import TritonAttention
from semantic.backends.torch.cuda.kernels import CudaKernels
from semantic.backends.torch.int8 import dequantize_rows, quantize_rows
from semantic.backends.torch.kernels import CpuKernels
from tests.unit.attention_reference import windowed_reference

ROOT = Path(__file__).parents[2]
PTXAS = Path(triton.__file__).parent / "backends/nvidia/bin/ptxas"

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
DTYPES = [torch.float32, torch.float16, pytest.param(torch.bfloat16, marks=needs_gpu)]
TOLERANCE = {torch.float32: 1e-5, torch.float16: 4e-3, torch.bfloat16: 2e-2}
# As on a GPU of 8 SMs: the tests' small shapes then split decodes, and tile prefills in rows of
# 64 and of 16, as a large GPU does larger shapes (and the interpreter runs fewer programs).
KERNELS = TritonAttention(sm_count=8)
BLOCK_TOKENS = 16  # divides none of the lengths below
LENGTHS = [1, 15, 17, 100, 300]  # 300: two decode splits


class Pool:
    """One layer's K/V pool with each sequence's blocks scattered among unused ones; page 0 is
    no sequence's, the stand-in a table names where a window has left its blocks. An int8 pool
    keeps the fp32 values its rows stand for beside them."""

    def __init__(
        self,
        lengths: list[int],
        kv_heads: int,
        dim: int,
        dtype: torch.dtype,
        int8: bool = False,
        block_tokens: int = BLOCK_TOKENS,
    ) -> None:
        self.bt = block_tokens
        per_seq = [-(-n // block_tokens) for n in lengths]
        blocks = list(range(1, 2 * sum(per_seq) + 1))
        random.Random(len(lengths)).shuffle(blocks)
        torch.manual_seed(sum(lengths))
        shape = (len(blocks) + 1, block_tokens, kv_heads, dim)
        k, v = torch.randn(shape) * 2, torch.randn(shape)
        self.tables = torch.zeros(len(lengths), max(per_seq), dtype=torch.int64)
        for i, count in enumerate(per_seq):
            self.tables[i, :count] = torch.tensor([blocks.pop() for _ in range(count)])
        self.lengths = torch.tensor(lengths, dtype=torch.int64)
        self.k_scales: torch.Tensor | None = None
        self.v_scales: torch.Tensor | None = None
        if int8:
            self.k, self.k_scales = quantize_rows(k)
            self.v, self.v_scales = quantize_rows(v)
        else:
            self.k, self.v = k.to(dtype), v.to(dtype)

    def real(self, cache: torch.Tensor, scales: torch.Tensor | None) -> torch.Tensor:
        """The fp32 values a cache holds (int8 rows dequantized)."""
        return cache.float() if scales is None else dequantize_rows(cache, scales, torch.float32)

    def rows(self, i: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Sequence i's first `count` keys and values [count, KVH, D] in fp32, NaN made 0."""
        blocks = self.tables[i, : -(-count // self.bt)]
        k, v = self.real(self.k, self.k_scales), self.real(self.v, self.v_scales)
        k, v = (x[blocks].flatten(0, 1)[:count].nan_to_num() for x in (k, v))
        return k, v

    def forget_before(self, i: int, first: int) -> None:
        """Keys before `first` of sequence i turn to NaN (an int8 row: its scale), and its
        blocks wholly before become page 0 in its table, all NaN: a kernel that reads any of
        them returns NaN."""
        caches = [self.k, self.v]
        if self.k_scales is not None and self.v_scales is not None:
            caches = [self.k_scales, self.v_scales]
        for pos in range(first):
            block = self.tables[i, pos // self.bt]
            for cache in caches:
                cache[block, pos % self.bt] = float("nan")
        self.tables[i, : first // self.bt] = 0
        for cache in caches:
            cache[0] = float("nan")

    def on_device(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """K, V, the block tables and the lengths on the test's device."""
        k, v, tables, lengths = (x.to(DEVICE) for x in (self.k, self.v, self.tables, self.lengths))
        return k, v, tables, lengths

    def scales_on_device(self) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        if self.k_scales is None or self.v_scales is None:
            return None, None
        return self.k_scales.to(DEVICE), self.v_scales.to(DEVICE)


def decode(
    kernels: TritonAttention,
    pool: Pool,
    q: torch.Tensor,
    window: int | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    sinks = None if sinks is None else sinks.to(DEVICE)
    out = kernels.decode_attention(
        q.to(DEVICE), *pool.on_device(), q.shape[-1] ** -0.5, window, sinks,
        *pool.scales_on_device(),
    )  # fmt: skip
    assert out.dtype == q.dtype and out.shape == q.shape
    return out.cpu()


def assert_decode_matches(
    out: torch.Tensor,
    pool: Pool,
    q: torch.Tensor,
    window: int | None = None,
    sinks: torch.Tensor | None = None,
) -> None:
    for i, n in enumerate(pool.lengths.tolist()):
        k, v = pool.rows(i, n)
        scale = q.shape[-1] ** -0.5
        expected = windowed_reference(q[i : i + 1], k, v, [n - 1], scale, window, sinks)
        tol = TOLERANCE[q.dtype]
        torch.testing.assert_close(out[i : i + 1].float(), expected, atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("heads", "kv_heads", "dim"), [(4, 4, 32), (9, 3, 64), (8, 2, 48)])
def test_decode_over_scattered_blocks_equals_the_reference(dtype, heads, kv_heads, dim):
    # GQA ratios 1, 3 and 4; head_dim 48 is padded to 64 in registers.
    pool = Pool(LENGTHS, kv_heads, dim, dtype)
    q = torch.randn(len(LENGTHS), heads, dim).to(dtype)
    assert_decode_matches(decode(KERNELS, pool, q), pool, q)


def test_decode_splits_long_contexts_by_shape_and_merges_them_exactly():
    pool = Pool([700, 3], 2, 32, torch.float32)
    q = torch.randn(2, 6, 32)
    # 44 blocks of 16: 704 keys, 3 splits of at least 256 (the program count asks for more)
    assert KERNELS.decode_splits(2, 2, pool.tables.shape[1] * BLOCK_TOKENS) == 3
    assert TritonAttention(sm_count=132).decode_splits(32, 8, 4096) == 2  # 1B, batch 32
    single = TritonAttention(sm_count=1)  # 2 programs already cover it twice: one split
    assert single.decode_splits(2, 2, pool.tables.shape[1] * BLOCK_TOKENS) == 1
    split_out, single_out = decode(KERNELS, pool, q), decode(single, pool, q)
    assert_decode_matches(split_out, pool, q)
    torch.testing.assert_close(split_out, single_out, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("window", "with_sinks"), [(5, False), (40, True), (None, True), (700, False), (16, True)]
)
def test_decode_reads_only_its_window_and_weighs_sinks(dtype, window, with_sinks):
    pool = Pool(LENGTHS, 2, 32, dtype)
    q = torch.randn(len(LENGTHS), 8, 32).to(dtype)
    sinks = torch.randn(8) * 3 if with_sinks else None
    for i, n in enumerate(LENGTHS):
        pool.forget_before(i, max(0, n - (window or n)))
    out = decode(KERNELS, pool, q, window, sinks)
    assert out.isfinite().all()
    assert_decode_matches(out, pool, q, window, sinks)


@pytest.mark.parametrize("int8", [False, True])
@pytest.mark.parametrize("block_tokens", [24, 128])
def test_decode_reads_blocks_of_any_size(block_tokens, int8):
    """Blocks of 128 hold two key tiles each; blocks of 24 tokens (no power of two) are read
    through a page lookup per key."""
    pool = Pool(LENGTHS, 2, 32, torch.float32, int8, block_tokens)
    q = torch.randn(len(LENGTHS), 6, 32)
    sinks = torch.randn(6)
    for i, n in enumerate(LENGTHS):
        pool.forget_before(i, max(0, n - 70))
    assert_decode_matches(decode(KERNELS, pool, q, 70, sinks), pool, q, 70, sinks)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("heads", "kv_heads", "dim", "window", "with_sinks"),
    [(9, 3, 64, None, False), (4, 4, 32, 40, True), (2, 1, 16, 5, False)],
)
def test_int8_decode_equals_attention_over_the_dequantized_rows(
    dtype, heads, kv_heads, dim, window, with_sinks
):
    pool = Pool(LENGTHS, kv_heads, dim, dtype, int8=True)
    q = torch.randn(len(LENGTHS), heads, dim).to(dtype)
    sinks = torch.randn(heads) * 3 if with_sinks else None
    for i, n in enumerate(LENGTHS):
        pool.forget_before(i, max(0, n - (window or n)))
    assert_decode_matches(decode(KERNELS, pool, q, window, sinks), pool, q, window, sinks)


def test_decode_padding_rows_run_harmlessly_beside_real_ones():
    """A graph bucket's padding rows (context 1, a table of zeros) give finite rows of their
    own and leave the real rows as they are without them."""
    pool = Pool([40, 130], 2, 32, torch.float32)
    q = torch.randn(2, 4, 32)
    alone = decode(KERNELS, pool, q)
    pool.tables = torch.cat([pool.tables, torch.zeros(3, pool.tables.shape[1], dtype=torch.int64)])
    pool.lengths = torch.tensor([40, 130, 1, 1, 1])
    padded = decode(KERNELS, pool, torch.cat([q, torch.randn(3, 4, 32)]))
    assert padded.isfinite().all()
    torch.testing.assert_close(padded[:2], alone, atol=1e-6, rtol=1e-6)


def test_decode_takes_q_as_a_strided_view():
    pool = Pool([5, 40], 2, 64, torch.float32)
    qkv = torch.randn(2, 6 + 2 * 2, 64)
    q = qkv[:, :6]
    torch.testing.assert_close(decode(KERNELS, pool, q), decode(KERNELS, pool, q.contiguous()))


@needs_gpu
def test_decode_replays_in_a_cuda_graph_with_new_tables_and_lengths():
    """Captured once, replayed after the step's inputs change in place: no host sync, and
    grids and buffers fixed by shapes, so the replay equals an eager call on the new inputs."""
    pool = Pool([40, 300, 1], 3, 64, torch.bfloat16)
    k, v, tables, lengths = pool.on_device()
    q = torch.randn(3, 9, 64, device=DEVICE).bfloat16()

    def step() -> torch.Tensor:
        return KERNELS.decode_attention(q, k, v, tables, lengths, 0.125)

    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        step()  # compiles outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    q.copy_(torch.randn_like(q))
    lengths.copy_(torch.tensor([250, 12, 1], device=DEVICE))
    tables.copy_(tables.flip(0))
    graph.replay()
    torch.testing.assert_close(out, step())


class PrefillCase:
    """A chunk of `n` queries after `context` tokens of its sequence; the pool holds context
    and chunk in blocks scattered among unused ones (as `Pool`, one sequence)."""

    def __init__(
        self,
        context: int,
        n: int,
        heads: int,
        kv_heads: int,
        dim: int,
        dtype: torch.dtype = torch.float32,
        int8: bool = False,
        block_tokens: int = BLOCK_TOKENS,
    ) -> None:
        self.context, self.n = context, n
        self.pool = Pool([context + n], kv_heads, dim, dtype, int8, block_tokens)
        self.q = torch.randn(n, heads, dim).to(dtype)

    def chunk_kv(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The chunk's own rows [n, KVH, D], as the model has them before attention."""
        table = self.pool.tables[0]
        k, v = (c[table].flatten(0, 1) for c in (self.pool.k, self.pool.v))
        span = slice(self.context, self.context + self.n)
        return k[span], v[span]

    def attend(
        self,
        window: int | None = None,
        sinks: torch.Tensor | None = None,
        kernels: TritonAttention = KERNELS,
    ) -> torch.Tensor:
        k, v, tables, _ = self.pool.on_device()
        sinks = None if sinks is None else sinks.to(DEVICE)
        out = kernels.prefill_attention(
            self.q.to(DEVICE), k, v, tables[0], self.context, self.q.shape[-1] ** -0.5,
            window, sinks, *self.pool.scales_on_device(),
        )  # fmt: skip
        assert out.dtype == self.q.dtype and out.shape == self.q.shape
        return out.cpu()

    def expected(self, window: int | None = None, sinks: torch.Tensor | None = None):
        k, v = self.pool.rows(0, self.context + self.n)
        positions = list(range(self.context, self.context + self.n))
        scale = self.q.shape[-1] ** -0.5
        return windowed_reference(self.q, k, v, positions, scale, window, sinks)


def assert_prefill_close(out: torch.Tensor, expected: torch.Tensor) -> None:
    tol = TOLERANCE[out.dtype]
    torch.testing.assert_close(out.float(), expected, atol=tol, rtol=tol)


PREFILL_CASES = [  # (context, n, heads, kv_heads, head_dim): n fills no whole 64-row tile
    (37, 50, 4, 4, 64),  # GQA ratio 1
    (130, 100, 9, 3, 64),  # rows (query, head) of a tile span queries unevenly
    (64, 64, 3, 1, 16),  # context ends on a key tile's edge
    (200, 1, 6, 2, 32),
    (5, 70, 8, 2, 128),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("context", "n", "heads", "kv_heads", "dim"), PREFILL_CASES)
def test_prefill_with_context_equals_the_reference(dtype, context, n, heads, kv_heads, dim):
    case = PrefillCase(context, n, heads, kv_heads, dim, dtype)
    assert_prefill_close(case.attend(), case.expected())


def test_short_chunks_take_smaller_row_tiles_to_fill_the_sms():
    h100 = TritonAttention(sm_count=132)
    assert h100.prefill_tiles(4000, 8, 64, torch.bfloat16).rows == 64  # 1B, 1,000 tokens
    assert h100.prefill_tiles(300, 3, 64, torch.bfloat16).rows == 16  # SmolLM2, 100 tokens
    assert h100.prefill_tiles(4000, 8, 128, torch.bfloat16).warps == 8
    tiles = [
        KERNELS.prefill_tiles(n * h // kvh, kvh, d, torch.float32)
        for _, n, h, kvh, d in PREFILL_CASES
    ]
    assert {t.rows for t in tiles} == {16, 32, 64}  # the cases above take each


@pytest.mark.parametrize("dtype", DTYPES)
def test_prefill_without_context_reads_the_chunks_own_strided_kv(dtype):
    # The model passes q, k, v as slices of its fused QKV projection.
    case = PrefillCase(0, 90, 9, 3, 64, dtype)
    k, v = case.chunk_kv()
    qkv = torch.cat([case.q, k, v], dim=1).to(DEVICE)
    q, k, v = qkv[:, :9], qkv[:, 9:12], qkv[:, 12:]
    out = KERNELS.prefill_attention(q, k, v, None, 0, 64**-0.5)
    assert_prefill_close(out.cpu(), case.expected())


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("context", "n", "window", "with_sinks"),
    [
        (200, 90, 70, True),  # the window starts mid key tile and mid block
        (150, 40, 1, False),  # each query sees itself only
        (300, 17, None, True),  # sinks on a full layer
        (100, 60, 512, True),  # a window wider than the sequence
    ],
)
def test_prefill_reads_only_its_window_and_weighs_sinks(dtype, context, n, window, with_sinks):
    case = PrefillCase(context, n, 8, 2, 32, dtype)
    sinks = torch.randn(8) * 3 if with_sinks else None
    # Keys before the first query's window are never read (and its pages may be gone).
    case.pool.forget_before(0, max(0, context - (window or context + 1) + 1))
    out = case.attend(window, sinks)
    assert out.isfinite().all()
    assert_prefill_close(out, case.expected(window, sinks))


@pytest.mark.parametrize("int8", [False, True])
@pytest.mark.parametrize("block_tokens", [24, 128])
def test_prefill_reads_blocks_of_any_size(block_tokens, int8):
    case = PrefillCase(220, 100, 6, 2, 32, torch.float32, int8, block_tokens)
    sinks = torch.randn(6)
    # The window's first key, 151, lies in the block of 24 from 144: keys 128-143, in the key
    # tile that holds it, belong to a block a sliding layer has given back.
    case.pool.forget_before(0, 220 - 70 + 1)
    assert_prefill_close(case.attend(70, sinks), case.expected(70, sinks))


@pytest.mark.parametrize("window", [None, 30])
def test_prefill_without_context_takes_windows_and_sinks(window):
    case = PrefillCase(0, 100, 6, 3, 32)
    sinks = torch.randn(6) * 3
    k, v = (x.to(DEVICE) for x in case.chunk_kv())
    out = KERNELS.prefill_attention(case.q.to(DEVICE), k, v, None, 0, 32**-0.5, window, sinks)
    assert_prefill_close(out.cpu(), case.expected(window, sinks))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("context", "n", "heads", "kv_heads", "dim", "window"),
    [(130, 100, 9, 3, 64, None), (300, 17, 8, 2, 32, 70), (64, 64, 3, 1, 16, None)],
)
def test_int8_prefill_equals_attention_over_the_dequantized_rows(
    dtype, context, n, heads, kv_heads, dim, window
):
    case = PrefillCase(context, n, heads, kv_heads, dim, dtype, int8=True)
    case.pool.forget_before(0, max(0, context - (window or context + 1) + 1))
    assert_prefill_close(case.attend(window), case.expected(window))


def test_support_and_refusals():
    assert KERNELS.supports_attention(64, 9, torch.bfloat16)
    assert KERNELS.supports_attention(80, 32, torch.float16)
    assert not KERNELS.supports_attention(512, 8, torch.float32)
    assert not KERNELS.supports_attention(64, 8, torch.int8)
    pool = Pool([20], 1, 32, torch.float32, int8=True)
    q = torch.randn(1, 2, 32, device=DEVICE)
    with pytest.raises(ValueError, match="need their scales"):
        KERNELS.decode_attention(q, *pool.on_device(), 0.1)


@pytest.mark.skipif(not PTXAS.exists(), reason="Triton has no ptxas for CUDA here")
def test_the_kernels_compile_for_an_h100_and_16_bit_ones_spill_no_registers():
    """What the interpreter never checks -- types that must agree across branches, tl.dot's
    shapes, register pressure -- checked by compiling each kind of launch for sm_90."""
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    result = subprocess.run(
        [sys.executable, "-m", "tests.unit.triton_compile"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "_prefill_kernel" in result.stdout and "_merge_splits_kernel" in result.stdout


@pytest.mark.parametrize("method", ["supports_attention", "decode_attention", "prefill_attention"])
def test_entry_points_take_the_cpu_kernels_parameters(method):
    """The pool calls either kernel class the same way."""
    ours = inspect.signature(getattr(TritonAttention, method)).parameters
    theirs = inspect.signature(getattr(CpuKernels, method)).parameters
    assert [(p.name, p.default) for p in ours.values()] == [
        (p.name, p.default) for p in theirs.values()
    ]


def test_the_pools_attention_runs_through_triton_as_through_the_stock_path():
    pool = Pool([30, 70], 2, 32, torch.float32)
    k, v, tables, lengths = pool.on_device()
    stock_kv = LayerKV(k, v, GatherScratch(k))
    triton_kv = LayerKV(k, v, GatherScratch(k), CudaKernels())
    how = LayerAttention(32**-0.5)
    q = torch.randn(2, 4, 32, device=DEVICE)
    mask = torch.arange(70, device=DEVICE)[None, None, None] < lengths[:, None, None, None]
    group = DecodeGroup(2, 70, tables, lengths, mask)
    torch.testing.assert_close(
        decode_attention(q, triton_kv, group, how), decode_attention(q, stock_kv, group, how)
    )
    chunk_q = torch.randn(20, 4, 32, device=DEVICE)
    chunk_mask = torch.ones(20, 70, dtype=torch.bool, device=DEVICE).tril_(50)
    chunk = PrefillChunk(0, 20, 50, tables[1], chunk_mask)
    own_k, own_v = (c[tables[1]].flatten(0, 1)[50:70] for c in (k, v))
    torch.testing.assert_close(
        prefill_attention(chunk_q, own_k, own_v, triton_kv, chunk, how),
        prefill_attention(chunk_q, own_k, own_v, stock_kv, chunk, how),
    )
