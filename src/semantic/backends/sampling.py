"""The sampling rules every backend's sampler shares, whatever holds its logits: the error of a
row with no token to give, the seed of each draw, which ids a row suppresses, the grammar
side of structured output (each constrained row's mask, and its matcher taking the row's token),
and which rows ask for log probabilities and how their tokens carry them.

No torch and no mlx here: the MLX backend samples over numpy on hosts without torch.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence

import numpy as np

from semantic.core import BatchItem, TokenLogprob
from semantic.text.grammar import GrammarStates

# Top-p first looks among this many most likely tokens; a nucleus wider than them (rare: a flat
# distribution) falls back to sorting the whole vocabulary.
TOP_P_CANDIDATES = 1024


class Unsampleable(ValueError):
    """A row whose logits or probabilities are not finite numbers: it has no token to give."""


def row_outcome(
    token: int, usable: bool, item: BatchItem, draw: Callable[[], int], failure: Exception | None
) -> int | Exception:
    """One row's result from its best allowed `token` (and whether that token's logit is
    finite): its grammar's `failure` first, then `Unsampleable`, then the token when greedy,
    else what `draw` gives. Whatever the draw raises is this row's alone."""
    if failure is not None:
        return failure
    if not usable:
        return Unsampleable("no token the model and its constraints allow")
    if item.sampling.greedy:
        return token
    try:
        return draw()
    except Exception as exc:  # this row's alone, whatever its cause
        return exc


def step_seed(seed: int, num_output_tokens: int) -> int:
    """A 63-bit seed for one draw: the same (seed, position) gives the same draw in any process."""
    digest = hashlib.blake2b(f"{seed}:{num_output_tokens}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def suppressed_ids(item: BatchItem, vocab: int) -> list[int]:
    """The ids a row may not be given this step, among the `vocab` its logits hold."""
    # The scheduler names the tokens a request may not end with yet (before min_tokens). An id
    # past the logits (a tokenizer larger than the model's vocabulary) can never be drawn
    # anyway; indexing with it would fail the row, and on CUDA the device.
    return [token for token in item.suppress_token_ids if 0 <= token < vocab]


def penalized_ids(item: BatchItem, vocab: int, drafted: int = 0) -> np.ndarray | None:
    """The distinct ids a row's repetition penalty lowers this step (its context's, prompt and
    output, among the `vocab` its logits hold), or None when it has no penalty. At a draft's
    position `drafted` (0: its decode token's), the draft tokens before it count as seen too:
    once accepted they are the context that plain decoding would have there."""
    if item.sampling.repetition_penalty == 1 or not item.context_token_ids:
        return None
    seen = [*item.context_token_ids, *item.draft_token_ids[:drafted]]
    ids = np.unique(np.asarray(seen, dtype=np.int64))
    return ids[(ids >= 0) & (ids < vocab)]


def grammar_masks(
    items: Sequence[BatchItem], grammars: GrammarStates | None
) -> tuple[dict[int, np.ndarray], dict[int, Exception]]:
    """The allowed-token bitmask of each row with a grammar, and the rows whose grammar failed."""
    rows = [row for row, item in enumerate(items) if item.sampling.grammar is not None]
    if not rows or grammars is None:
        return {}, {}
    mask, errors = grammars.bitmask(
        [(items[r].seq_id, items[r].sampling.grammar, items[r].num_output_tokens) for r in rows]
    )
    masks = {row: mask[i] for i, row in enumerate(rows) if i not in errors}
    return masks, {rows[i]: error for i, error in errors.items()}


def allows(mask: np.ndarray, token: int) -> bool:
    """Whether a bitmask row (int32 words, one bit per token id) allows `token`."""
    return 0 <= token < mask.shape[0] * 32 and bool((int(mask[token >> 5]) >> (token & 31)) & 1)


def advance(
    grammars: GrammarStates | None, items: Sequence[BatchItem], outcomes: list[int | Exception]
) -> list[int | Exception]:
    """Each constrained row's matcher takes its token; a token it refuses fails the row."""
    assert grammars is not None
    for row, item in enumerate(items):
        token = outcomes[row]
        if item.sampling.grammar is not None and isinstance(token, int):
            error = grammars.accept(item.seq_id, token)
            outcomes[row] = token if error is None else error
    return outcomes


def logprob_rows(items: Sequence[BatchItem]) -> tuple[list[int], int]:
    """The rows whose requests ask for log probabilities, and the most alternatives any of them
    asks for. A step where none asks computes nothing more than it did before."""
    rows = [row for row, item in enumerate(items) if item.sampling.logprobs is not None]
    return rows, max((items[row].sampling.logprobs or 0 for row in rows), default=0)


def with_logprobs(
    outcomes: list[int | Exception],
    items: Sequence[BatchItem],
    rows: Sequence[int],
    chosen: Sequence[float],
    top: Sequence[Sequence[tuple[int, float]]],
) -> list[int | TokenLogprob | Exception]:
    """Each token of `rows` (the rows that asked) as a `TokenLogprob`: its own log probability
    (`chosen`, by position in `rows`) and as many of the row's most likely tokens (`top`) as its
    request asked for. A row without a token keeps its error."""
    result: list[int | TokenLogprob | Exception] = list(outcomes)
    for i, row in enumerate(rows):
        token = outcomes[row]
        if not isinstance(token, Exception):
            wanted = items[row].sampling.logprobs or 0
            result[row] = TokenLogprob(token, chosen[i], tuple(top[i][:wanted]))
    return result
