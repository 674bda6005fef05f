"""The one port between the engine and compute: a backend runs a `Batch` and samples tokens."""

from __future__ import annotations

from typing import Protocol

from semantic.core import Batch, CacheSpec


class ModelRunner(Protocol):
    """A model bound to its KV block pool tensors (torch, mlx, or the fake one for tests).

    The runner owns the tensors; the engine owns which block ids are whose. `num_blocks` is fixed
    when the runner is built (from the cache budget) and the engine sizes its `BlockPool` from it.
    """

    cache_spec: CacheSpec
    num_blocks: int
    vocab_size: int

    def run(self, batch: Batch) -> list[int | None]:
        """Compute every item of `batch`, writing K/V into the pool through the items' block
        tables, and return one sampled token per item with `sample=True` (None for the others),
        in the order of `batch.items`."""
        ...
