"""Decode steps over a bucket's static inputs (`cuda/graphs.py`): on the CPU the same views run
eagerly, so the layout, the padding rows and the choice of bucket are checked here; the capture
itself in `test_cuda_graphs_replay_the_eager_step`, on a GPU."""

from __future__ import annotations

import pytest
import torch

from semantic.backends.torch.cuda.graphs import DecodeGraphs
from semantic.backends.torch.cuda.kernels import CudaKernels
from semantic.backends.torch.runner import TorchRunner
from semantic.core import Batch, BatchItem, SamplingParams
from tests.unit.test_cpu_kernels import KERNELS, needs_kernels
from tests.unit.tiny_llama import tiny_llama

GREEDY = SamplingParams(temperature=0.0)
BT = 16
PROMPTS = [[(13 * s + 7 * i) % 300 for i in range(n)] for s, n in ((1, 5), (2, 40), (3, 150))]
TABLES = [list(range(100 + 20 * i, 120 + 20 * i)) for i in range(len(PROMPTS))]


def runner(device: str = "cpu", kernels: str = "ours") -> TorchRunner:
    """fp32, with our kernels for the device, or ("triton") CUDA's on the CPU, in Triton's
    interpreter."""
    config, weights = tiny_llama(tied=False)
    chosen = CudaKernels() if kernels == "triton" else True
    return TorchRunner(
        config,
        weights,
        block_tokens=BT,
        cache_budget_mb=8,
        dtype="float32",
        device=device,
        kernels=chosen,
    )


def graphs_of(run: TorchRunner, max_batch: int = 4, max_blocks: int = 12) -> DecodeGraphs:
    """Graphs whose spare page is the pool's last (no table here names it)."""
    return DecodeGraphs(
        run.model,
        run.pool.layers,
        groups=1,
        block_tokens=BT,
        max_blocks=max_blocks,
        spare_page=run.num_blocks - 1,
        max_batch=max_batch,
        device=run.device,
    )


def prefilled(run: TorchRunner) -> None:
    for i, ids in enumerate(PROMPTS):
        run.forward_logits(Batch([BatchItem(i, ids, 0, [TABLES[i]], True, GREEDY, 0)]))


def decodes(step: int, count: int = len(PROMPTS)) -> list[BatchItem]:
    return [
        BatchItem(i, [11 * step + i], len(PROMPTS[i]) + step, [TABLES[i]], True, GREEDY, step)
        for i in range(count)
    ]


@pytest.mark.parametrize("kernels", ["ours", "triton"])
def test_a_decode_batch_over_a_larger_buckets_static_inputs_matches_the_eager_step(kernels):
    if kernels == "ours" and KERNELS is None:
        pytest.skip("needs our CPU kernels (AVX-512 BF16)")
    eager, static = runner(kernels=kernels), runner(kernels=kernels)
    prefilled(eager)
    prefilled(static)
    graphs = graphs_of(static)
    for step in range(3):  # 3 sequences in the bucket of 4: one padding row
        items = decodes(step)
        expected = eager.forward_logits(Batch(items))
        with torch.inference_mode():
            got = graphs.logits(items)
        assert got is not None and got.shape == expected.shape
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    used = sorted({page for table in TABLES for page in table})
    # Both wrote the same K/V (a batch of 4 rows may round its products apart from one of 3),
    # and the padding rows only to the spare page.
    torch.testing.assert_close(static.pool.data[:, :, used], eager.pool.data[:, :, used])
    assert not static.pool.data[:, :, : used[0]].any()
    assert static.pool.data[:, :, static.num_blocks - 1].any()


@needs_kernels
def test_each_batch_runs_the_smallest_bucket_that_holds_it():
    graphs = graphs_of(runner(), max_batch=3)
    assert sorted(graphs.buckets) == [1, 2, 3]
    for count, size in ((1, 1), (2, 2), (3, 3)):
        bucket = graphs._bucket_for(decodes(0, count))
        assert bucket is not None and bucket.size == size


@needs_kernels
def test_batches_a_graph_cannot_hold_run_eagerly():
    run = runner()
    graphs = graphs_of(run, max_batch=2, max_blocks=3)
    chunk = BatchItem(0, [1, 2], 5, [TABLES[0]], True, GREEDY, 0)
    past_the_tables = BatchItem(2, [1], 3 * BT, [TABLES[2]], True, GREEDY, 0)
    unsampled = BatchItem(0, [1], 5, [TABLES[0]], False, GREEDY, 0)
    assert graphs.logits([]) is None
    assert graphs.logits(decodes(0, 3)) is None  # more sequences than the largest bucket
    assert graphs.logits([chunk]) is None
    assert graphs.logits([past_the_tables]) is None
    assert graphs.logits([unsampled]) is None


def test_cuda_graphs_replay_the_eager_step():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    eager, captured = runner("cuda"), runner("cuda")
    assert captured.graphs is not None and eager.graphs is not None
    eager.graphs = None  # the same model, stepped without its graphs
    prefilled(eager)
    prefilled(captured)
    assert all(bucket.graph is not None for bucket in captured.graphs.buckets.values())
    for step in range(3):
        items = decodes(step)
        expected = eager.forward_logits(Batch(items))
        got = captured.forward_logits(Batch(items))
        torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
