"""The one port between the engine and compute: a backend runs a `Batch` and samples tokens."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol

from semantic.cache.pages.page import PageKV
from semantic.core import Batch, CacheSpec, StepToken, TokenLogprob
from semantic.errors import RowsFailed


class ModelRunner(Protocol):
    """A model bound to its KV block pool tensors (torch, mlx, or the fake one for tests).

    The runner owns the tensors; the engine owns which pages are whose. `num_blocks` (pages: a
    layer group's K/V of one block, every layer's when the model has one group) is fixed when
    the runner is built (from the cache budget) and the engine sizes its `BlockPool` from it.

    A runner that verifies drafts (speculative decoding) says so with a `verifies_drafts`
    attribute set to True; the engine never hands a draft to one that does not (`drafting`).
    """

    cache_spec: CacheSpec
    num_blocks: int
    vocab_size: int

    def run(self, batch: Batch) -> Sequence[StepToken]:
        """Compute every item of `batch`, writing K/V into the pool through the items' block
        tables (one per layer group), and return one sampled token per item with `sample=True`
        (None for the others), in the order of `batch.items`; a `TokenLogprob` for an item whose
        request asks for log probabilities. `batch.copies` are done first.
        An item with a draft gets a list instead: the draft tokens accepted, in order, then
        the token sampled after them (so at least one token); the K/V written at the positions
        of the rejected ones is garbage the engine overwrites later.

        An item that cannot be sampled fails alone: `run` raises `RowsFailed` naming it, with
        the other items' tokens (`step_tokens` builds either answer). Any other exception fails
        every item of the step."""
        ...

    def forget(self, seq_id: int) -> None:
        """Forget what the runner keeps of a sequence that has ended (its grammar's progress)."""
        ...

    def read_block(self, block: int) -> PageKV:
        """A host copy of one page's K and V as the pool stores them (`cache/pages/page.py`), for
        the disk tier."""
        ...

    def write_block(self, block: int, kv: PageKV) -> None:
        """Fill one page with K and V read back from disk (as `read_block` returns them)."""
        ...


def drafting(runner: ModelRunner) -> bool:
    """Whether `runner` verifies drafts (`ModelRunner`): off unless it says so."""
    return getattr(runner, "verifies_drafts", False) is True


def step_tokens(
    num_items: int, outcomes: Iterable[tuple[int, int | TokenLogprob | list[int] | Exception]]
) -> list[StepToken]:
    """What `run` returns, from each sampled item's outcome: (batch index, its token(s) or why it
    has none). Raises `RowsFailed` when any item has none, carrying the others' tokens."""
    tokens: list[StepToken] = [None] * num_items
    errors: dict[int, Exception] = {}
    for index, outcome in outcomes:
        if isinstance(outcome, Exception):
            errors[index] = outcome
        else:
            tokens[index] = outcome
    if errors:
        raise RowsFailed(tokens, errors)
    return tokens
