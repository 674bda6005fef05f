"""Our CPU kernels against torch's: paged decode and prefill attention read in place equal SDPA
over the gathered blocks, the small-row linear equals `F.linear`, RMSNorm equals the stock
formula, and a bf16 model runs the same with them as with the stock kernels."""

from __future__ import annotations

import logging
import random
import re
import shutil
import types
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.utils import cpp_extension

from semantic.backends.torch import kernels as kernels_module
from semantic.backends.torch.attention import GatherScratch, LayerAttention, LayerKV, PrefillChunk
from semantic.backends.torch.attention import prefill_attention as stock_prefill_attention
from semantic.backends.torch.int8 import quantize_rows
from semantic.backends.torch.kernels import PanelWeight, cpu_kernels, unavailable_reason
from semantic.backends.torch.linear import Linear, OneDnnLinear, PanelLinear, UnpackScratch
from semantic.backends.torch.models.rope import Rope, apply_rope
from semantic.backends.torch.runner import TorchRunner
from semantic.core import Batch, BatchItem, SamplingParams
from tests.unit.attention_reference import windowed_reference
from tests.unit.tiny_llama import tiny_llama

KERNELS = cpu_kernels()
needs_kernels = pytest.mark.skipif(KERNELS is None, reason=f"no kernels: {unavailable_reason()}")
BLOCK_TOKENS = 16  # divides none of the lengths below
LENGTHS = [1, 15, 17, 100, 700]  # 700: several spans of one sequence, split across threads
BF16_ATOL = BF16_RTOL = 2e-2


class Pool:
    """One layer's K/V caches with each sequence's blocks scattered among unused ones."""

    def __init__(self, lengths: list[int], kv_heads: int, dim: int, dtype: torch.dtype) -> None:
        per_seq = [-(-n // BLOCK_TOKENS) for n in lengths]
        blocks = list(range(2 * sum(per_seq)))
        random.Random(0).shuffle(blocks)
        torch.manual_seed(0)
        shape = (len(blocks), BLOCK_TOKENS, kv_heads, dim)
        self.k = torch.randn(shape).to(dtype)
        self.v = torch.randn(shape).to(dtype)
        width = max(per_seq)
        self.tables = torch.zeros(len(lengths), width, dtype=torch.int64)
        for i, count in enumerate(per_seq):
            self.tables[i, :count] = torch.tensor([blocks.pop() for _ in range(count)])
        self.lengths = torch.tensor(lengths, dtype=torch.int64)

    def dense(self, q: torch.Tensor, scale: float) -> torch.Tensor:
        """Reference: per sequence, SDPA in fp32 over its gathered blocks, K/V heads repeated."""
        heads, kv_heads = q.shape[1], self.k.shape[2]
        outs = []
        for i, n in enumerate(self.lengths.tolist()):
            blocks = self.tables[i, : -(-n // BLOCK_TOKENS)]
            k = self.k[blocks].flatten(0, 1)[:n].float().repeat_interleave(heads // kv_heads, 1)
            v = self.v[blocks].flatten(0, 1)[:n].float().repeat_interleave(heads // kv_heads, 1)
            qi = q[i].float()[:, None]  # [H, 1, D]
            kt, vt = k.transpose(0, 1), v.transpose(0, 1)  # [H, n, D]
            outs.append(F.scaled_dot_product_attention(qi, kt, vt, scale=scale))
        return torch.stack(outs)[:, :, 0]  # [B, H, D]

    def attend(self, q: torch.Tensor, scale: float) -> torch.Tensor:
        assert KERNELS is not None
        return KERNELS.decode_attention(q, self.k, self.v, self.tables, self.lengths, scale)


@pytest.mark.parametrize("kind", ["panel", "onednn"])
def test_onednn_sees_rows_padded_to_16_and_each_row_gets_its_answer(kind, monkeypatch):
    """oneDNN keeps a kernel for every row count it sees (linear.py): it must see few."""
    if kind == "panel" and KERNELS is None:
        pytest.skip(f"no kernels: {unavailable_reason()}")
    if not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        pytest.skip("oneDNN packs bf16 only on CPUs with AVX-512 or AVX-NE-CONVERT")
    w, bias = torch.randn(50, 72).bfloat16(), torch.randn(50).bfloat16()
    reference, seen = F.linear, []

    def spy(x, *args):
        seen.append(len(x))
        return reference(x, *args)

    linear: Linear = OneDnnLinear(w, bias)
    if kind == "panel":
        assert KERNELS is not None
        linear = PanelLinear(w, bias, KERNELS, UnpackScratch())
        monkeypatch.setattr(F, "linear", spy)
    for rows in (17, 129, 144, 145, 200):  # up to 128, our kernel's
        x = torch.randn(rows, 72).bfloat16()
        expected = reference(x, w, bias).float()
        torch.testing.assert_close(linear(x).float(), expected, atol=BF16_ATOL, rtol=BF16_RTOL)
    assert seen == ([144, 144, 160, 208] if kind == "panel" else [])


@needs_kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
# (14, 2, 64): the 0.5B coder's, 7 query heads a KV head: one value pass of 7 (of 8 at most)
@pytest.mark.parametrize(
    ("heads", "kv_heads", "dim"), [(9, 3, 64), (4, 4, 64), (8, 2, 128), (14, 2, 64)]
)
def test_paged_decode_equals_dense_attention_over_gathered_blocks(dtype, heads, kv_heads, dim):
    pool = Pool(LENGTHS, kv_heads, dim, dtype)
    q = torch.randn(len(LENGTHS), heads, dim).to(dtype)
    out = pool.attend(q, dim**-0.5)
    assert out.dtype == dtype
    tol = 1e-5 if dtype == torch.float32 else BF16_ATOL
    torch.testing.assert_close(out.float(), pool.dense(q, dim**-0.5), atol=tol, rtol=tol)


@needs_kernels
def test_paged_decode_takes_q_as_a_strided_view():
    # The model passes q as a slice of its fused QKV projection.
    pool = Pool([5, 40], 2, 64, torch.bfloat16)
    qkv = torch.randn(2, 6 + 2 * 2, 64).bfloat16()
    q = qkv[:, :6]
    torch.testing.assert_close(pool.attend(q, 0.125), pool.attend(q.contiguous(), 0.125))


@needs_kernels
def test_paged_decode_reads_only_its_blocks_and_lengths():
    pool = Pool([9, 30], 3, 64, torch.float32)
    q = torch.randn(2, 6, 64)
    expected = pool.attend(q, 0.125)
    used = torch.zeros(pool.k.shape[0], BLOCK_TOKENS, dtype=torch.bool)
    for i, n in enumerate(pool.lengths.tolist()):
        for pos in range(n):
            used[pool.tables[i, pos // BLOCK_TOKENS], pos % BLOCK_TOKENS] = True
    pool.k[~used] = float("nan")  # unused blocks and the slots past each length
    pool.v[~used] = float("inf")
    torch.testing.assert_close(pool.attend(q, 0.125), expected)


@needs_kernels
def test_paged_decode_rejects_a_block_outside_the_cache():
    pool = Pool([20], 1, 64, torch.float32)
    pool.tables[0, 1] = pool.k.shape[0]
    with pytest.raises(RuntimeError, match="outside the cache"):
        pool.attend(torch.randn(1, 1, 64), 0.125)


class PrefillCase:
    """A chunk of `n` queries after `context` tokens, whose K/V sit in blocks scattered among
    unused ones, listed out of order in the block table."""

    def __init__(self, context: int, n: int, heads: int, kv_heads: int, dim: int, bt: int):
        self.context, self.n, self.bt = context, n, bt
        count = -(-(context + n) // bt)
        blocks = list(range(2 * count + 1))
        random.Random(context + n).shuffle(blocks)
        torch.manual_seed(n)
        self.k = torch.randn(len(blocks), bt, kv_heads, dim)
        self.v = torch.randn(len(blocks), bt, kv_heads, dim)
        self.q = torch.randn(n, heads, dim)
        self.table = torch.tensor(blocks[:count])
        self.scale = dim**-0.5

    def chunk_kv(self, cache: torch.Tensor) -> torch.Tensor:
        """The chunk's own rows [n, KVH, D], as the model has them before attention."""
        rows = cache[self.table].flatten(0, 1)
        return rows[self.context : self.context + self.n]

    def stock(self) -> torch.Tensor:
        """Reference: the stock gather + SDPA path, in fp32 on the same values."""
        kv = LayerKV(self.k.float(), self.v.float(), GatherScratch(self.k.float()))
        total = self.context + self.n
        mask = torch.ones(self.n, total, dtype=torch.bool).tril_(self.context)
        chunk = PrefillChunk(0, self.n, self.context, self.table, mask)
        k, v = self.chunk_kv(kv.k), self.chunk_kv(kv.v)
        how = LayerAttention(self.scale)
        return stock_prefill_attention(self.q.float(), k, v, kv, chunk, how)

    def to(self, dtype: torch.dtype) -> PrefillCase:
        self.k, self.v, self.q = self.k.to(dtype), self.v.to(dtype), self.q.to(dtype)
        return self

    def attend(self) -> torch.Tensor:
        assert KERNELS is not None
        return KERNELS.prefill_attention(
            self.q, self.k, self.v, self.table, self.context, self.scale
        )


PREFILL_CASES = [  # (context, n, heads, kv_heads, head_dim, block_tokens)
    (0, 100, 9, 3, 64, 16),  # no context; 100 fills no whole query or key tile
    (37, 50, 4, 4, 64, 16),  # GQA ratio 1
    (512, 488, 9, 3, 64, 256),  # the server's second chunk of a 1,000-token prompt
    (300, 17, 8, 2, 128, 16),
    (5, 70, 6, 3, 32, 256),
    (64, 64, 3, 1, 16, 16),  # context ends on a key tile's edge
    (200, 1, 9, 3, 64, 16),
]


@needs_kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("context", "n", "heads", "kv_heads", "dim", "bt"), PREFILL_CASES)
def test_paged_prefill_equals_gather_and_sdpa(dtype, context, n, heads, kv_heads, dim, bt):
    case = PrefillCase(context, n, heads, kv_heads, dim, bt).to(dtype)
    out = case.attend()
    assert out.dtype == dtype and out.shape == (n, heads, dim)
    tol = 1e-5 if dtype == torch.float32 else BF16_ATOL
    torch.testing.assert_close(out.float(), case.stock(), atol=tol, rtol=tol)


@needs_kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_paged_prefill_without_context_reads_the_chunks_own_strided_kv(dtype):
    # The model passes q, k, v as slices of its fused QKV projection.
    assert KERNELS is not None
    case = PrefillCase(0, 90, 9, 3, 64, 16).to(dtype)
    qkv = torch.cat([case.q, case.chunk_kv(case.k), case.chunk_kv(case.v)], dim=1)
    q, k, v = qkv[:, :9], qkv[:, 9:12], qkv[:, 12:]
    out = KERNELS.prefill_attention(q, k, v, None, 0, case.scale)
    torch.testing.assert_close(out, case.attend())


@needs_kernels
def test_paged_prefill_reads_only_its_blocks_and_keys():
    case = PrefillCase(70, 30, 6, 2, 64, 16)
    expected = case.attend()
    used = torch.zeros(case.k.shape[0], case.bt, dtype=torch.bool)
    for pos in range(case.context + case.n):
        used[case.table[pos // case.bt], pos % case.bt] = True
    case.k[~used] = float("nan")  # unused blocks and the slots past the chunk
    case.v[~used] = float("nan")
    out = case.attend()
    assert out.isfinite().all()
    torch.testing.assert_close(out, expected)


@needs_kernels
def test_paged_prefill_rejects_a_block_outside_the_cache():
    case = PrefillCase(20, 10, 2, 1, 64, 16)
    case.table[1] = case.k.shape[0]
    with pytest.raises(RuntimeError, match="outside the cache"):
        case.attend()


@needs_kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    ("window", "with_sinks", "dim"),
    [(5, False, 64), (40, True, 256), (None, True, 64), (700, False, 256)],
)
def test_paged_decode_reads_only_its_window_and_weighs_sinks(dtype, window, with_sinks, dim):
    pool = Pool(LENGTHS, 2, dim, dtype)
    heads = 8
    q = torch.randn(len(LENGTHS), heads, dim).to(dtype)
    sinks = torch.randn(heads) * 3 if with_sinks else None
    for i, n in enumerate(pool.lengths.tolist()):  # keys before the window are never read
        first = max(0, n - (window or n))
        for pos in range(first):
            block = pool.tables[i, pos // BLOCK_TOKENS]
            pool.k[block, pos % BLOCK_TOKENS] = float("nan")
            pool.v[block, pos % BLOCK_TOKENS] = float("nan")
    assert KERNELS is not None
    out = KERNELS.decode_attention(
        q, pool.k, pool.v, pool.tables, pool.lengths, dim**-0.5, window, sinks
    )
    tol = 1e-5 if dtype == torch.float32 else BF16_ATOL
    for i, n in enumerate(pool.lengths.tolist()):
        blocks = pool.tables[i, : -(-n // BLOCK_TOKENS)]
        k = pool.k[blocks].flatten(0, 1)[:n].nan_to_num()
        v = pool.v[blocks].flatten(0, 1)[:n].nan_to_num()
        expected = windowed_reference(q[i : i + 1], k, v, [n - 1], dim**-0.5, window, sinks)
        torch.testing.assert_close(out[i : i + 1].float(), expected, atol=tol, rtol=tol)


@needs_kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    ("context", "n", "window", "with_sinks", "dim"),
    [
        (0, 100, 30, False, 64),  # no context: the chunk's own K/V
        (200, 90, 70, True, 64),  # the window starts mid key tile and mid block
        (150, 40, 1, False, 32),  # each query sees itself only
        (300, 17, None, True, 256),  # sinks on a full layer, Gemma's head_dim
        (100, 60, 512, True, 256),  # a window wider than the sequence
    ],
)
def test_paged_prefill_reads_only_its_window_and_weighs_sinks(
    dtype, context, n, window, with_sinks, dim
):
    case = PrefillCase(context, n, 8, 2, dim, 16).to(dtype)
    sinks = torch.randn(8) * 3 if with_sinks else None
    # Keys before the key tile (64) holding the first query's window are never read.
    first_tile = max(0, context - (window or context + 1) + 1) // 64 * 64
    for pos in range(first_tile):
        case.k[case.table[pos // case.bt], pos % case.bt] = float("nan")
        case.v[case.table[pos // case.bt], pos % case.bt] = float("nan")
    assert KERNELS is not None
    if context == 0:
        k, v = case.chunk_kv(case.k), case.chunk_kv(case.v)
        out = KERNELS.prefill_attention(case.q, k, v, None, 0, case.scale, window, sinks)
    else:
        out = KERNELS.prefill_attention(
            case.q, case.k, case.v, case.table, context, case.scale, window, sinks
        )
    keys = case.k[case.table].flatten(0, 1)[: context + n].nan_to_num()
    values = case.v[case.table].flatten(0, 1)[: context + n].nan_to_num()
    positions = list(range(context, context + n))
    expected = windowed_reference(case.q, keys, values, positions, case.scale, window, sinks)
    tol = 1e-5 if dtype == torch.float32 else BF16_ATOL
    torch.testing.assert_close(out.float(), expected, atol=tol, rtol=tol)


@needs_kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_scaled_in_fp32_rounds_once(dtype):
    assert KERNELS is not None
    x, w = torch.randn(5, 640).to(dtype), (1 + torch.randn(640) * 0.1).to(dtype)
    expected = (F.rms_norm(x.float(), (640,), eps=1e-6) * w.float()).to(dtype)
    out = KERNELS.rms_norm(x, w, 1e-6, round_normed=False)
    tol = 1e-6 if dtype == torch.float32 else 1e-2  # bf16: a rounding tie may go either way
    torch.testing.assert_close(out, expected, atol=tol, rtol=tol)


@needs_kernels
@pytest.mark.parametrize("rows", [*range(1, 17), 23, 40])  # beyond 16: two passes a panel
@pytest.mark.parametrize(("n", "k"), [(1, 1), (33, 71), (96, 576), (17, 2)])
def test_small_row_linear_equals_f_linear(rows, n, k):
    assert KERNELS is not None
    torch.manual_seed(rows)
    x, w, bias = torch.randn(rows, k).bfloat16(), torch.randn(n, k).bfloat16(), torch.randn(n)
    weight = PanelWeight.pack(w)
    for b in (None, bias.bfloat16()):
        out = KERNELS.linear(x, weight, b)
        expected = F.linear(x.float(), w.float(), None if b is None else b.float())
        assert out.dtype == torch.bfloat16 and out.shape == (rows, n)
        torch.testing.assert_close(out.float(), expected, atol=BF16_ATOL, rtol=BF16_RTOL)


@needs_kernels
def test_small_row_linear_gives_a_row_the_same_bits_alone_and_batched():
    assert KERNELS is not None
    x, weight = torch.randn(12, 200).bfloat16(), PanelWeight.pack(torch.randn(70, 200).bfloat16())
    together = KERNELS.linear(x, weight, None)
    for i in range(12):
        assert torch.equal(KERNELS.linear(x[i : i + 1], weight, None)[0], together[i])


@needs_kernels
@pytest.mark.parametrize(("n", "k"), [(1, 1), (33, 71), (96, 576), (40, 64)])
def test_panel_weight_unpacks_and_gives_rows_exactly(n, k):
    assert KERNELS is not None
    w = torch.randn(n, k).bfloat16()
    weight = PanelWeight.pack(w)
    assert torch.equal(KERNELS.unpack(weight, torch.empty(n, k, dtype=torch.bfloat16)), w)
    ids = torch.tensor([0, n - 1, n // 2, 0])
    assert torch.equal(weight.rows(ids), w[ids])


@needs_kernels
def test_panel_linear_equals_f_linear_for_few_rows_and_for_many():
    assert KERNELS is not None
    w, bias = torch.randn(50, 72).bfloat16(), torch.randn(50).bfloat16()
    linear = PanelLinear(w, bias, KERNELS, UnpackScratch())
    for rows in (3, 70):
        x = torch.randn(rows, 72).bfloat16()
        expected = F.linear(x, w, bias).float()
        torch.testing.assert_close(linear(x).float(), expected, atol=BF16_ATOL, rtol=BF16_RTOL)


@needs_kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_equals_the_stock_formula(dtype):
    assert KERNELS is not None
    x, w = torch.randn(5, 70).to(dtype) * 3, torch.randn(70).to(dtype)
    expected = w * F.rms_norm(x.float(), (70,), eps=1e-5).to(dtype)
    out = KERNELS.rms_norm(x[:, :70], w, 1e-5)
    tol = 1e-6 if dtype == torch.float32 else 1e-2  # bf16: a rounding tie may go either way
    torch.testing.assert_close(out, expected, atol=tol, rtol=tol)


@needs_kernels
@pytest.mark.parametrize("dim", [32, 64, 128, 256])
def test_rope_gives_the_bits_of_the_torch_version_on_a_strided_view(dim):
    assert KERNELS is not None
    torch.manual_seed(dim)
    rope = Rope(dim, 10000.0, None, torch.device("cpu"))
    cos, sin_signed = rope.tables(torch.arange(40) * 37, torch.bfloat16)
    qkv = (torch.randn(40, 13, dim) * 4).bfloat16()
    qk = qkv[:, :11]  # q and k heads of a fused projection's output, as attention passes them
    out = KERNELS.rope(qk, cos, sin_signed)
    assert out.is_contiguous() and torch.equal(out, apply_rope(qk, cos, sin_signed))


@needs_kernels
@pytest.mark.parametrize("inner", [16, 44, 1536])  # 44: a partial vector at the end
def test_swiglu_gives_the_bits_of_silu_times_up(inner):
    assert KERNELS is not None
    torch.manual_seed(inner)
    gate_up = (torch.randn(9, 2 * inner) * 6).bfloat16()  # both signs, large and tiny values
    gate_up[0, :inner] = torch.tensor([0.0, -0.0, 100.0, -100.0]).repeat(inner // 4)
    gate, up = gate_up.chunk(2, dim=-1)
    assert torch.equal(KERNELS.swiglu(gate_up), F.silu(gate) * up)


def step_logits(runner: TorchRunner, prompts: list[list[int]], steps: int) -> list[torch.Tensor]:
    """Prefill each prompt in two chunks (all but 3 tokens, then 3), then decode them together
    for `steps` steps of fixed tokens; the logits of every step."""
    greedy = SamplingParams(temperature=0.0)
    tables = [list(range(i * 16, (i + 1) * 16)) for i in range(len(prompts))]
    logits = []
    for i, ids in enumerate(prompts):
        split = len(ids) - 3
        runner.forward_logits(Batch([BatchItem(i, ids[:split], 0, [tables[i]], False, greedy, 0)]))
        item = BatchItem(i, ids[split:], split, [tables[i]], True, greedy, 0)
        logits.append(runner.forward_logits(Batch([item])))
    for n in range(steps):
        items = [
            BatchItem(i, [7 * n + i], len(ids) + n, [tables[i]], True, greedy, n + 1)
            for i, ids in enumerate(prompts)
        ]
        logits.append(runner.forward_logits(Batch(items)))
    return logits


@needs_kernels
@pytest.mark.parametrize("tied", [True, False])
def test_bf16_model_with_our_kernels_matches_the_stock_kernels(tied):
    config, weights = tiny_llama(tied)
    runners = [
        TorchRunner(
            config, weights, block_tokens=16, cache_budget_mb=8, dtype="bfloat16", kernels=on
        )
        for on in (True, False)
    ]
    # first chunks of 20 rows (our kernel) and 147 (over 128: unpacked for oneDNN), then 3 each
    prompts = [[random.Random(s).randrange(300) for _ in range(n)] for s, n in ((1, 23), (2, 150))]
    ours, stock = (step_logits(r, prompts, steps=4) for r in runners)
    for a, b in zip(ours, stock, strict=True):
        torch.testing.assert_close(a, b, atol=5e-2, rtol=5e-2)


def test_a_failed_build_leaves_the_stock_kernels_and_says_why(monkeypatch):
    def fail() -> None:
        raise RuntimeError("no compiler today")

    monkeypatch.setattr(kernels_module, "_missing_feature", lambda: None)
    monkeypatch.setattr(kernels_module, "_build", fail)
    kernels, reason = kernels_module._load.__wrapped__()
    assert kernels is None
    assert reason is not None and "no compiler today" in reason


def _checkout_copy(folder: Path) -> Path:
    """The kernel sources as another checkout of the same commit holds them."""
    folder.mkdir(parents=True)
    for name in (*kernels_module._SOURCES, *kernels_module._HEADERS):
        shutil.copy(kernels_module._FOLDER / name, folder / name)
    return folder


def test_the_build_folder_is_named_by_the_sources_contents_not_their_path(tmp_path: Path) -> None:
    first, second = _checkout_copy(tmp_path / "a"), _checkout_copy(tmp_path / "b")
    assert kernels_module.build_directory(first) == kernels_module.build_directory(second)
    assert kernels_module.build_directory(first) == kernels_module.build_directory()
    with (second / "rms_norm.cpp").open("a") as source:
        source.write("// changed\n")
    assert kernels_module.build_directory(first) != kernels_module.build_directory(second)


@needs_kernels
def test_another_checkout_loads_the_built_kernels_without_compiling(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The build this process loaded serves a checkout at another path, whose build files would
    otherwise name other paths and make the build tool compile everything again."""

    def compile_again(**options: object) -> None:
        raise AssertionError(f"compiled again: {options}")

    monkeypatch.setattr(cpp_extension, "load", compile_again)
    caplog.set_level(logging.INFO, logger=kernels_module.__name__)
    module = kernels_module._build(_checkout_copy(tmp_path / "other-checkout"))
    assert module.rms_norm is not None
    assert "loaded in" in caplog.text and "building" not in caplog.text


def test_a_build_says_that_it_builds_and_how_long_it_took(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    built: list[dict[str, object]] = []

    def fake_build(**options: object) -> types.ModuleType:
        built.append(options)
        return types.ModuleType("semantic_cpu_kernels")

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(cpp_extension, "load", fake_build)
    caplog.set_level(logging.INFO, logger=kernels_module.__name__)
    kernels_module._build()
    folder = kernels_module.build_directory()
    assert folder.is_relative_to(tmp_path / "cache")
    # compiled from copies inside the folder: its build files name no checkout
    assert all(Path(str(s)).parent == folder / "src" for s in built[0]["sources"])  # type: ignore[attr-defined]
    assert re.search(
        r"building the semantic CPU kernels into .*\n.*built .* in \d+\.\d s", caplog.text
    )


@needs_kernels
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("int8", [False, True])
def test_paged_decode_gives_a_sequence_the_same_bits_alone_and_in_any_batch(dtype, int8):
    # A verified draft's tokens are decodes of one batch: each must get exactly the output it
    # gets alone, whatever else decodes beside it.
    assert KERNELS is not None
    blocks, block_tokens, heads, kv_heads, dim = 12, 64, 12, 2, 128
    k, v = (
        torch.randn(blocks, block_tokens, kv_heads, dim),
        torch.randn(blocks, block_tokens, kv_heads, dim),
    )
    scales: tuple[torch.Tensor | None, ...] = (None, None)
    if int8:
        (k, k_scales), (v, v_scales) = quantize_rows(k), quantize_rows(v)
        scales = (k_scales, v_scales)
    else:
        k, v = k.to(dtype), v.to(dtype)
    lengths = torch.tensor([700, 31, 701, 702, 5, 750, 703, 704, 300])
    q = torch.randn(len(lengths), heads, dim).to(dtype)
    tables = torch.arange(blocks).repeat(len(lengths), 1)
    together = KERNELS.decode_attention(q, k, v, tables, lengths, 0.088, None, None, *scales)
    for i in range(len(lengths)):
        alone = KERNELS.decode_attention(
            q[i : i + 1], k, v, tables[i : i + 1], lengths[i : i + 1], 0.088, None, None, *scales
        )
        assert torch.equal(alone, together[i : i + 1])
