"""The 8-bit KV cache: rows quantized with a scale each, the CPU kernels reading int8 K/V in
place against a dequantized torch reference, the stock path's write and gather, the pool's
size and pages, and a tiny model run with an int8 pool on both paths."""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from semantic.backends.torch.attention import (
    DecodeGroup,
    KVPool,
    LayerAttention,
    LayerKV,
    PrefillChunk,
    decode_attention,
    prefill_attention,
    write_kv,
)
from semantic.backends.torch.int8 import dequantize_rows, quantize_rows
from semantic.backends.torch.runner import TorchRunner, pick_kv_dtype
from semantic.cache.disk.tier import BlockRecord, DiskTier, model_tag
from semantic.core import Batch, BatchItem, CacheSpec, SamplingParams
from semantic.errors import ModelLoadFailed
from tests.unit.attention_reference import windowed_reference
from tests.unit.test_cpu_kernels import (
    BF16_ATOL,
    BLOCK_TOKENS,
    KERNELS,
    LENGTHS,
    PrefillCase,
    needs_kernels,
    step_logits,
)
from tests.unit.tiny_llama import tiny_llama


def test_a_row_comes_back_within_half_a_step_of_its_scale():
    torch.manual_seed(0)
    # rows of very different magnitudes, as K rows of different heads are
    x = torch.randn(50, 3, 64) * torch.logspace(-3, 2, 3).view(1, 3, 1)
    values, scales = quantize_rows(x)
    assert values.dtype == torch.int8 and scales.dtype == torch.bfloat16
    assert scales.shape == (50, 3)
    assert int(values.abs().max()) == 127  # each row's largest value uses the whole range
    error = (dequantize_rows(values, scales, torch.float32) - x).abs()
    assert bool((error <= scales.float().unsqueeze(-1) / 2 * (1 + 1e-6)).all())


def test_a_zero_row_has_a_zero_scale_and_zero_values():
    x = torch.zeros(2, 1, 16)
    x[1, 0, 3] = -2.5
    values, scales = quantize_rows(x)
    assert float(scales[0, 0]) == 0.0 and not values[0].any()
    back = float(dequantize_rows(values, scales, torch.float32)[1, 0, 3])
    assert abs(back + 2.5) <= float(scales[1, 0]) / 2


def quantized(cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(int8 values, scales, the values they stand for in fp32) of a pool tensor."""
    values, scales = quantize_rows(cache)
    return values, scales, dequantize_rows(values, scales, torch.float32)


class Int8Pool:
    """One layer's int8 K/V with their scales, each sequence's blocks scattered among unused
    ones (as `test_cpu_kernels.Pool`), and the fp32 values they stand for."""

    def __init__(self, lengths: list[int], kv_heads: int, dim: int) -> None:
        per_seq = [-(-n // BLOCK_TOKENS) for n in lengths]
        blocks = list(range(2 * sum(per_seq)))
        random.Random(1).shuffle(blocks)
        torch.manual_seed(1)
        shape = (len(blocks), BLOCK_TOKENS, kv_heads, dim)
        self.k, self.k_scales, self.k_real = quantized(torch.randn(shape) * 4)
        self.v, self.v_scales, self.v_real = quantized(torch.randn(shape))
        self.tables = torch.zeros(len(lengths), max(per_seq), dtype=torch.int64)
        for i, count in enumerate(per_seq):
            self.tables[i, :count] = torch.tensor([blocks.pop() for _ in range(count)])
        self.lengths = torch.tensor(lengths, dtype=torch.int64)

    def rows(self, cache: torch.Tensor, i: int) -> torch.Tensor:
        n = int(self.lengths[i])
        return cache[self.tables[i, : -(-n // BLOCK_TOKENS)]].flatten(0, 1)[:n]


def kernel_queries(q: torch.Tensor) -> torch.Tensor:
    """q [B, H, D] as the int8 decode kernel takes it: per head, rounded to steps of
    max|q| / 32512 (15 bits, two int8 halves), in fp32."""
    q32 = q.float()
    top = q32.abs().amax(-1, keepdim=True)
    steps = (q32 * torch.where(top > 0, 32512.0 / top, 0.0)).round()
    return steps * (top / 32512.0)


@needs_kernels
def test_the_decode_benchmark_compares_builds_each_in_a_process_of_its_own():
    assert KERNELS is not None
    library = str(KERNELS._module.__file__)
    script = Path(__file__).parents[2] / "benchmarks" / "kv_decode_kernel.py"
    command = [sys.executable, str(script), "--library", library, "--library", library]
    command += ["--contexts", "40", "--runs", "1", "--rounds", "1"]
    out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    rows = [line.strip(" |").split(" | ") for line in out.splitlines() if "keys" in line]
    cases = [f"{kind}, 40 keys, {n} sequences" for n in (1, 8) for kind in ("bf16", "int8")]
    assert [row[0] for row in rows] == cases
    assert all(float(cell) > 0 for row in rows for cell in row[1:])


@needs_kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    ("heads", "kv_heads", "dim", "window", "with_sinks"),
    [
        (9, 3, 64, None, False),
        (4, 4, 32, 40, True),
        (8, 2, 128, None, True),
        (2, 1, 16, 5, False),
        (14, 2, 64, None, False),  # the 0.5B coder's: 7 heads a KV head, scores in 6 and 1
        (12, 2, 128, None, False),  # the 1.5B coder's: 6 heads a KV head, a chunk a values walk
        (4, 1, 256, 40, False),  # Gemma 3's: 4 heads, two chunks a values walk
    ],
)
def test_int8_paged_decode_equals_attention_over_the_dequantized_rows(
    dtype, heads, kv_heads, dim, window, with_sinks
):
    pool = Int8Pool(LENGTHS, kv_heads, dim)
    q = torch.randn(len(LENGTHS), heads, dim).to(dtype)
    sinks = torch.randn(heads) * 3 if with_sinks else None
    assert KERNELS is not None
    out = KERNELS.decode_attention(
        q, pool.k, pool.v, pool.tables, pool.lengths, dim**-0.5, window, sinks,
        pool.k_scales, pool.v_scales,
    )  # fmt: skip
    assert out.dtype == dtype
    # Its own rounding: q to 15 bits (stated in the reference), weights to 15 bits: their
    # roundings sum to ~1e-4 over a span (1.1e-4 at worst seen), a hundredth of the cache's own.
    tol = 2e-4 if dtype == torch.float32 else BF16_ATOL
    q15 = kernel_queries(q)
    for i, n in enumerate(pool.lengths.tolist()):
        k, v = pool.rows(pool.k_real, i), pool.rows(pool.v_real, i)
        expected = windowed_reference(q15[i : i + 1], k, v, [n - 1], dim**-0.5, window, sinks)
        torch.testing.assert_close(out[i : i + 1].float(), expected, atol=tol, rtol=tol)


@needs_kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    ("context", "n", "heads", "kv_heads", "dim", "bt", "window"),
    [
        (512, 488, 9, 3, 64, 256, None),  # the server's second chunk of a 1,000-token prompt
        (37, 50, 4, 4, 64, 16, None),
        (300, 17, 8, 2, 128, 16, 70),
        (64, 64, 3, 1, 16, 16, None),
        (200, 1, 9, 3, 64, 16, None),
    ],
)
def test_int8_paged_prefill_equals_attention_over_the_dequantized_rows(
    dtype, context, n, heads, kv_heads, dim, bt, window
):
    case = PrefillCase(context, n, heads, kv_heads, dim, bt)
    k, k_scales, k_real = quantized(case.k * 4)
    v, v_scales, v_real = quantized(case.v)
    q = case.q.to(dtype)
    assert KERNELS is not None
    out = KERNELS.prefill_attention(
        q, k, v, case.table, context, case.scale, window, None, k_scales, v_scales
    )
    # the kernel packs the dequantized rows in q's dtype: exact in fp32, rounded in bf16
    keys = k_real[case.table].flatten(0, 1)[: context + n].to(dtype)
    values = v_real[case.table].flatten(0, 1)[: context + n].to(dtype)
    positions = list(range(context, context + n))
    expected = windowed_reference(q, keys, values, positions, case.scale, window, None)
    tol = 1e-5 if dtype == torch.float32 else BF16_ATOL
    torch.testing.assert_close(out.float(), expected, atol=tol, rtol=tol)


@needs_kernels
def test_int8_kernels_refuse_int8_caches_without_scales_and_scales_without_int8():
    pool = Int8Pool([20], 1, 64)
    q = torch.randn(1, 2, 64)
    assert KERNELS is not None
    with pytest.raises(RuntimeError, match="need their scales"):
        KERNELS.decode_attention(q, pool.k, pool.v, pool.tables, pool.lengths, 0.1)
    with pytest.raises(RuntimeError, match="need int8 caches"):
        KERNELS.decode_attention(
            q, pool.k_real, pool.v_real, pool.tables, pool.lengths, 0.1, None, None,
            pool.k_scales, pool.v_scales,
        )  # fmt: skip
    with pytest.raises(RuntimeError, match="bfloat16"):
        KERNELS.decode_attention(
            q, pool.k, pool.v, pool.tables, pool.lengths, 0.1, None, None,
            pool.k_scales.float(), pool.v_scales,
        )  # fmt: skip


def int8_layer(num_blocks: int, kv_heads: int, dim: int) -> LayerKV:
    spec = CacheSpec(1, kv_heads, dim, "float32", BLOCK_TOKENS, kv_dtype="int8")
    pool = KVPool(spec, num_blocks, torch.device("cpu"))
    return pool.layers[0]


def test_the_stock_path_writes_int8_rows_and_attends_over_them_dequantized():
    """write_kv quantizes; decode and prefill gather and dequantize: the same answers as SDPA
    over the rows the pool stands for."""
    kv = int8_layer(8, 2, 64)
    torch.manual_seed(2)
    n, heads = 40, 4
    k, v = torch.randn(n, 2, 64), torch.randn(n, 2, 64)
    table = torch.tensor([5, 2, 7])  # 48 slots: 40 tokens
    slots = torch.cat([torch.arange(b * BLOCK_TOKENS, (b + 1) * BLOCK_TOKENS) for b in table])[:n]
    write_kv(kv, k, v, slots)
    assert kv.k.dtype == torch.int8 and kv.k_scales is not None
    k_real = dequantize_rows(*quantize_rows(k), torch.float32)
    v_real = dequantize_rows(*quantize_rows(v), torch.float32)
    how = LayerAttention(64**-0.5)
    q = torch.randn(1, heads, 64)
    group = DecodeGroup(1, n, table[None], torch.tensor([n]), None)
    expected = windowed_reference(q, k_real, v_real, [n - 1], how.scale, None, None)
    torch.testing.assert_close(decode_attention(q, kv, group, how), expected)
    qs = torch.randn(8, heads, 64)  # the last 8 tokens as a chunk after 32 of context
    mask = torch.ones(8, n, dtype=torch.bool).tril_(32)
    chunk = PrefillChunk(0, 8, 32, table, mask)
    out = prefill_attention(qs, k[32:], v[32:], kv, chunk, how)
    expected = windowed_reference(qs, k_real, v_real, list(range(32, 40)), how.scale, None, None)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


@needs_kernels
def test_our_kernel_writes_int8_rows_with_the_bits_of_the_stock_quantizer():
    assert KERNELS is not None
    spec = CacheSpec(1, 3, 64, "bfloat16", BLOCK_TOKENS, kv_dtype="int8")
    ours, stock = (
        KVPool(spec, 6, torch.device("cpu"), kernels).layers[0] for kernels in (KERNELS, None)
    )
    torch.manual_seed(3)
    # rows of very different sizes, an all-zero row, and K/V as views into a wider qkv row
    qkv = (torch.randn(20, 3, 3 * 64) * torch.logspace(-3, 2, 20)[:, None, None]).bfloat16()
    qkv[4, 1] = 0.0
    k, v = qkv[:, :, 64:128], qkv[:, :, 128:]
    slots = torch.randperm(6 * BLOCK_TOKENS)[:20]
    for layer in (ours, stock):
        write_kv(layer, k, v, slots)
    for name in ("k", "v", "k_scales", "v_scales"):
        assert torch.equal(getattr(ours, name), getattr(stock, name)), name
    with pytest.raises(RuntimeError, match="outside the cache"):
        write_kv(ours, k[:1], v[:1], torch.tensor([6 * BLOCK_TOKENS]))


def test_an_int8_page_is_copied_read_and_written_with_its_scales():
    spec = CacheSpec(2, 1, 16, "bfloat16", BLOCK_TOKENS, kv_dtype="int8")
    pool = KVPool(spec, 4, torch.device("cpu"))
    torch.manual_seed(3)
    for layer in pool.layers:
        write_kv(layer, torch.randn(5, 1, 16), torch.randn(5, 1, 16), torch.arange(16, 21))
    page = pool.read_page(1)
    assert page.k.dtype == np.int8 and page.k.shape == (2, BLOCK_TOKENS, 1, 16)
    assert page.k_scales is not None and page.k_scales.dtype == np.uint16
    assert page.k_scales.shape == (2, BLOCK_TOKENS, 1)
    pool.copy_page(1, 2)
    pool.write_page(3, page)
    assert pool.scales is not None
    for destination in (2, 3):
        assert torch.equal(pool.data[:, :, destination], pool.data[:, :, 1])
        assert torch.equal(pool.scales[:, :, destination], pool.scales[:, :, 1])
    assert pool.scales[:, :, 1].any() and not pool.scales[:, :, 0].any()


def test_an_int8_pool_holds_about_twice_the_blocks_of_a_bf16_one_in_its_budget():
    config, weights = tiny_llama(tied=True)
    runners = {
        kv_dtype: TorchRunner(
            config, weights, block_tokens=16, cache_budget_mb=4, kv_dtype=kv_dtype, kernels=False
        )
        for kv_dtype in ("model", "int8")
    }
    model, int8 = runners["model"], runners["int8"]
    assert model.cache_spec.kv_dtype is None and int8.cache_spec.kv_dtype == "int8"
    # head_dim 64: 64 bytes and a 2-byte scale a row against 64 values in the model's dtype
    # (bf16, or fp32 on a CPU without bf16 arithmetic)
    width = 64 * getattr(torch, model.cache_spec.dtype).itemsize
    assert int8.cache_spec.bytes_per_page * width == model.cache_spec.bytes_per_page * 66
    assert int8.num_blocks == 4 * 2**20 // int8.cache_spec.bytes_per_page
    assert int8.num_blocks > 1.9 * model.num_blocks
    assert model.cache_spec.tag() != int8.cache_spec.tag()
    assert "kvint8" in int8.cache_spec.tag() and "kv" + "int8" not in model.cache_spec.tag()


def test_an_unknown_kv_dtype_is_refused():
    config, weights = tiny_llama(tied=True)
    with pytest.raises(ModelLoadFailed, match="kv_dtype"):
        TorchRunner(config, weights, block_tokens=16, cache_budget_mb=4, kv_dtype="fp8")
    with pytest.raises(ValueError, match="KV dtype"):
        CacheSpec(1, 1, 16, "bfloat16", 16, kv_dtype="int4")


@pytest.mark.parametrize(
    ("in_place", "dtype", "stored"),
    [(True, torch.bfloat16, "int8"), (True, torch.float32, None), (False, torch.bfloat16, None)],
)
def test_auto_is_int8_only_where_our_kernels_read_it_beside_a_bf16_model(in_place, dtype, stored):
    assert pick_kv_dtype("auto", in_place, dtype) == stored
    assert pick_kv_dtype("model", in_place, dtype) is None
    assert pick_kv_dtype("int8", in_place, dtype) == "int8"


@needs_kernels
def test_a_bf16_model_on_our_kernels_keeps_an_8_bit_cache_by_default():
    config, weights = tiny_llama(tied=True)
    runner = TorchRunner(config, weights, block_tokens=16, cache_budget_mb=4, dtype="bfloat16")
    assert runner.cache_spec.kv_dtype == "int8"


def int8_runner(
    kernels: bool,
    dtype: str = "bfloat16",
    kv_dtype: str = "int8",
    device: str = "cpu",
    weights: str = "bf16",
) -> TorchRunner:
    config, parameters = tiny_llama(tied=False)
    return TorchRunner(
        config,
        parameters,
        block_tokens=16,
        cache_budget_mb=8,
        dtype=dtype,
        device=device,
        kv_dtype=kv_dtype,
        weight_format=weights,
        kernels=kernels,
    )


PROMPTS = [[random.Random(s).randrange(300) for _ in range(n)] for s, n in ((1, 23), (2, 150))]


@needs_kernels
def test_an_int8_model_with_our_kernels_matches_the_stock_kernels():
    ours, stock = (step_logits(int8_runner(on), PROMPTS, steps=4) for on in (True, False))
    for a, b in zip(ours, stock, strict=True):
        torch.testing.assert_close(a, b, atol=5e-2, rtol=5e-2)


@pytest.mark.parametrize("kernels", [True, False])
def test_an_int8_cache_stays_close_to_the_model_dtypes(kernels):
    """fp32 model, so the only difference is the cache's: logits within a few hundredths."""
    if kernels and KERNELS is None:
        pytest.skip("no kernels")
    full = step_logits(int8_runner(kernels, "float32", "model"), PROMPTS, steps=4)
    int8 = step_logits(int8_runner(kernels, "float32"), PROMPTS, steps=4)
    for a, b in zip(int8, full, strict=True):
        assert float((a - b).abs().max()) < 0.05 * float(b.abs().max())
        assert torch.equal(a.argmax(-1), b.argmax(-1))


def test_an_int8_page_through_the_disk_tier_decodes_as_before(tmp_path):
    """Prefill a prompt, write its page to disk as the pool holds it, read it back into
    another page: a decode over the restored page gives the same logits."""
    runner = int8_runner(kernels=KERNELS is not None)
    greedy = SamplingParams(temperature=0.0)
    prompt = PROMPTS[0][:16]  # one whole block
    runner.forward_logits(Batch([BatchItem(0, prompt, 0, [[3]], False, greedy, 0)]))
    spec = runner.cache_spec
    tier = DiskTier(
        tmp_path, model_tag=model_tag("m", spec, "f" * 32), spec=spec, budget_bytes=1 << 30
    )
    assert tier.write(BlockRecord(7, None, tuple(prompt), runner.read_block(3))) > 0
    record = tier.read(7)
    assert record is not None and record.kv.k.dtype == np.int8
    runner.write_block(5, record.kv)

    def next_logits(page: int) -> torch.Tensor:
        item = BatchItem(0, [11], 16, [[page, 9]], True, greedy, 1)
        return runner.forward_logits(Batch([item]))

    assert torch.equal(next_logits(5), next_logits(3))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize(
    ("kv_dtype", "weights"), [("int8", "bf16"), ("model", "int8"), ("int8", "int8")]
)
def test_8_bit_kv_and_weights_on_cuda_give_the_logits_of_the_cpus_stock_path(kv_dtype, weights):
    """CUDA takes the stock path (a dequantizing gather, a dequantizing linear); fp32, so the
    devices differ only in their arithmetic's order."""
    cuda, cpu = (
        step_logits(int8_runner(False, "float32", kv_dtype, device, weights), PROMPTS, steps=4)
        for device in ("cuda", "cpu")
    )
    for a, b in zip(cuda, cpu, strict=True):
        torch.testing.assert_close(a.cpu(), b, atol=2e-3, rtol=2e-3)
