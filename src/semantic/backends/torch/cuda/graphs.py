"""Decode steps replayed as CUDA graphs: one graph per batch-size bucket, captured at start-up
over static input tensors, so a step launches one graph instead of ~20 kernels a layer.

A small model's decode step on a GPU is bound by the CPU launching kernels (~11 ms a step for
SmolLM2's 30 layers, measured on an H200 with the eager path): the GPU itself needs ~2 ms. A
graph replays the recorded launches with none of that CPU work. What a graph reads must sit at
the addresses it was recorded with, so each bucket owns one int64 tensor that holds the step's
token ids, positions, context lengths, pool slots and block tables (views of it are what the
recorded kernels read), filled by one host-to-device copy a step. A batch of B sequences runs the
smallest bucket ≥ B; its extra rows read one key from page 0 and write their K/V to a spare page
no block table names, and their logits are dropped. Prefill chunks, batches larger than the
largest bucket and sequences longer than the tables run eagerly.

Capture needs attention that reads the pool through tensors of fixed shape with no host
synchronisation (the Triton kernels of `cuda/attention.py`); the stock path's gather sizes its
copy from the step's longest sequence. On the CPU nothing is captured: the same static views
run eagerly, which is how the tests check the padding and the layout without a GPU.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

import torch

from semantic.backends.torch.attention import (
    AttentionMetadata,
    DecodeGroup,
    GroupView,
    LayerKV,
)
from semantic.backends.torch.models.layers import DecoderModel
from semantic.core import BatchItem

if TYPE_CHECKING:
    from torch.cuda.graphs import _POOL_HANDLE

log = logging.getLogger(__name__)
T = TypeVar("T")

BUCKETS = (1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 192, 256)
# Capture stops once this is spent at start-up; the buckets left run eagerly.
CAPTURE_BUDGET_S = 30.0


@dataclass(slots=True)
class _Bucket:
    """One batch size's static inputs and, once captured, its graph and the logits it writes.

    `inputs` [B · (3 + G + G · W)] int64 is laid out as token ids [B], positions [B], context
    lengths [B], then per group its slots [B] and its block tables [B, W]; `meta` views it."""

    size: int
    inputs: torch.Tensor
    input_ids: torch.Tensor
    positions: torch.Tensor
    meta: AttentionMetadata
    graph: torch.cuda.CUDAGraph | None = None
    logits: torch.Tensor | None = None


class DecodeGraphs:
    """The decode step of up to `max_batch` sequences, per bucket: static inputs, and on CUDA a
    captured graph. `logits(items)` answers a decode-only batch it can take, else None."""

    def __init__(
        self,
        model: DecoderModel,
        layers: list[LayerKV],
        *,
        groups: int,
        block_tokens: int,
        max_blocks: int,
        spare_page: int,
        max_batch: int,
        device: torch.device,
    ) -> None:
        self.model = model
        self.layers = layers
        self.groups = groups
        self.bt = block_tokens
        self.width = max_blocks  # W: the block tables' fixed width
        self.pad_slot = spare_page * block_tokens
        self.device = device
        sizes = [size for size in BUCKETS if size < max_batch] + [max_batch]
        self.buckets = {size: self._bucket(size) for size in sizes}

    def _bucket(self, size: int) -> _Bucket:
        groups, width = self.groups, self.width
        inputs = torch.zeros(size * (3 + groups + groups * width), dtype=torch.int64)
        inputs = inputs.to(self.device)
        ids, positions, lens = inputs[: 3 * size].view(3, size)
        rest = inputs[3 * size :].view(groups, size * (1 + width))
        views = [
            GroupView(
                slot_mapping=group[:size],
                decode=DecodeGroup(
                    num_tokens=size,
                    num_keys=width * self.bt,
                    block_tables=group[size:].view(size, width),
                    context_lens=lens,
                    mask=None,
                ),
                prefills=[],
            )
            for group in rest
        ]
        return _Bucket(size, inputs, ids, positions, AttentionMetadata(views))

    def capture(self, budget_s: float) -> list[int]:
        """Record each bucket's graph, largest first (the smaller ones then fit in the memory
        the larger left), until `budget_s` is spent; returns the sizes captured. The buckets
        left run eagerly over their static inputs, as every bucket does on the CPU."""
        started = time.perf_counter()
        pool = torch.cuda.graph_pool_handle()
        captured: list[int] = []
        for size in sorted(self.buckets, reverse=True):
            if time.perf_counter() - started > budget_s:
                break
            self._capture(self.buckets[size], pool)
            captured.append(size)
        log.info(
            "captured %d decode graphs (batch %s) in %.1f s",
            len(captured),
            ", ".join(map(str, sorted(captured))),
            time.perf_counter() - started,
        )
        return captured

    def _capture(self, bucket: _Bucket, pool: _POOL_HANDLE) -> None:
        self._fill(bucket, [])  # padding only: a harmless step to record
        bucket.graph, bucket.logits = record_graph(self._forward(bucket), pool)

    def _forward(self, bucket: _Bucket) -> Callable[[], torch.Tensor]:
        def forward() -> torch.Tensor:
            hidden = self.model.forward(
                bucket.input_ids, bucket.positions, self.layers, bucket.meta
            )
            return self.model.logits(hidden)  # [B, V] fp32

        return forward

    def logits(self, items: list[BatchItem]) -> torch.Tensor | None:
        """fp32 logits [len(items), V] of a batch of decodes, by the bucket that holds it; None
        when the batch is not one (a prefill chunk, too many sequences, or a table too long)."""
        bucket = self._bucket_for(items)
        if bucket is None:
            return None
        self._fill(bucket, items)
        if bucket.graph is None:
            return self._forward(bucket)()[: len(items)]
        bucket.graph.replay()
        assert bucket.logits is not None
        return bucket.logits[: len(items)]

    def _bucket_for(self, items: list[BatchItem]) -> _Bucket | None:
        sizes = [size for size in self.buckets if size >= len(items)]
        if not items or not sizes:
            return None
        for item in items:
            if len(item.token_ids) != 1 or not item.sample:
                return None
            if item.start_pos // self.bt >= self.width:
                return None
        return self.buckets[min(sizes)]

    def _fill(self, bucket: _Bucket, items: list[BatchItem]) -> None:
        """One host-to-device copy of the step's inputs into the bucket's tensor; the rows past
        the batch are padding (token 0 at position 0, one key, its K/V to the spare page)."""
        bt, width, pad = self.bt, self.width, bucket.size - len(items)
        ids = [item.token_ids[0] for item in items] + [0] * pad
        positions = [item.start_pos for item in items] + [0] * pad
        lens = [item.start_pos + 1 for item in items] + [1] * pad
        values = ids + positions + lens
        for group in range(self.groups):
            tables = [item.block_tables[group][:width] for item in items]
            starts = positions[: len(items)]
            values += [t[p // bt] * bt + p % bt for t, p in zip(tables, starts, strict=True)]
            values += [self.pad_slot] * pad
            for table in tables:
                values += table + [0] * (width - len(table))
            values += [0] * (width * pad)
        bucket.inputs.copy_(torch.tensor(values, dtype=torch.int64))


def record_graph(
    fn: Callable[[], T], pool: _POOL_HANDLE | None = None, warmups: int = 1
) -> tuple[torch.cuda.CUDAGraph, T]:
    """`fn` recorded in a CUDA graph (its memory from `pool`, if given), and what it returned
    while recorded, which every replay rewrites. It runs `warmups` times on a side stream first,
    as capture requires: that compiles the Triton kernels, lets cuBLAS pick its own and sizes
    the caching allocator outside the capture."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmups):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        out = fn()
    return graph, out
