"""Picking each next token from the MLX backend's logits, on the host in numpy and without
torch: the torch sampler's rules exactly (greedy, temperature, top-k then top-p, suppressed
ids, grammar masks), so a request samples alike on either backend.

A seeded request draws from `np.random.default_rng(step_seed(seed, tokens generated so far))`,
so its output is reproducible whatever it is batched with. A row that cannot be sampled
(non-finite logits or probabilities, a draw that raises, a grammar that fails) gets its error
instead of a token, and fails its own request, never the batch. A row whose request asks for
log probabilities gets them from its logits as the model gave them (`_logprobs`).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

import numpy as np

from semantic.backends.sampling import (
    TOP_P_CANDIDATES,
    Unsampleable,
    advance,
    allows,
    grammar_masks,
    logprob_rows,
    penalized_ids,
    row_outcome,
    step_seed,
    suppressed_ids,
    with_logprobs,
)
from semantic.core import BatchItem, SamplingParams, TokenLogprob
from semantic.text.grammar import GrammarStates, allowed


def sample(
    logits: np.ndarray, items: Sequence[BatchItem], grammars: GrammarStates | None = None
) -> list[int | TokenLogprob | Exception]:
    """logits: [N, V] float32, one row per item, written in place → per item, its token id (a
    `TokenLogprob` where its request asks for log probabilities) or why it has none.
    `grammars` holds the matchers of the items with a grammar."""
    rows, k = logprob_rows(items)
    logprobs = _log_softmax(logits[rows]) if rows else None  # a copy, before the writes below
    outcomes = _tokens(logits, items, grammars)
    if logprobs is None:
        return list(outcomes)
    return with_logprobs(outcomes, items, rows, *_chosen_and_top(logprobs, rows, outcomes, k))


def _chosen_and_top(
    logprobs: np.ndarray, rows: list[int], outcomes: list[int | Exception], k: int
) -> tuple[list[float], list[list[tuple[int, float]]]]:
    """logprobs: [R, V] of `rows` → each row's token's log probability, and its `k` most
    likely tokens as (id, log probability)."""
    tokens = [o if isinstance(o, int) else 0 for o in (outcomes[r] for r in rows)]
    chosen = logprobs[np.arange(len(rows)), tokens].tolist()
    top = []
    for row in logprobs:
        ids = _largest(row, min(k, row.shape[-1])) if k else np.empty(0, np.int64)
        top.append(list(zip(ids.tolist(), row[ids].tolist(), strict=True)))
    return chosen, top


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    with np.errstate(all="ignore"):  # a row that is not finite fails in `_tokens` anyway
        shifted = logits - logits.max(-1, keepdims=True)
        return shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))


def _tokens(
    logits: np.ndarray, items: Sequence[BatchItem], grammars: GrammarStates | None
) -> list[int | Exception]:
    """Each row's token id or why it has none (`sample`, without log probabilities)."""
    _penalize(logits, items)
    _suppress(logits, items)
    masks, failed = grammar_masks(items, grammars)
    best = logits.argmax(-1)
    # argmax picks a NaN or +inf where a row has one, and -inf only when all are: so the
    # chosen logit is finite exactly when the row is usable.
    tokens = best.tolist()
    usable = np.isfinite(logits[np.arange(len(items)), best]).tolist()
    outcomes: list[int | Exception] = []
    for row, item in enumerate(items):
        mask = masks.get(row)
        if mask is not None and not (item.sampling.greedy and allows(mask, tokens[row])):
            # A greedy row whose best token the grammar allows needs no mask at all.
            tokens[row], usable[row] = _masked_best(logits[row], mask)
        drawn = partial(draw, logits[row], item.sampling, item.num_output_tokens)
        outcomes.append(row_outcome(tokens[row], usable[row], item, drawn, failed.get(row)))
    return advance(grammars, items, outcomes) if masks else outcomes


def _penalize(logits: np.ndarray, items: Sequence[BatchItem]) -> None:
    for row, item in enumerate(items):
        ids = penalized_ids(item, logits.shape[-1])
        if ids is not None and len(ids):
            seen, penalty = logits[row, ids], item.sampling.repetition_penalty
            logits[row, ids] = np.where(seen > 0, seen / penalty, seen * penalty)


def _suppress(logits: np.ndarray, items: Sequence[BatchItem]) -> None:
    for row, item in enumerate(items):
        ids = suppressed_ids(item, logits.shape[-1])
        if ids:
            logits[row, ids] = -np.inf


def _masked_best(logits: np.ndarray, mask: np.ndarray) -> tuple[int, bool]:
    """logits: [V] → every token the mask forbids set to -inf (in place: a draw reads them), and
    the best token left, with whether it is finite."""
    np.copyto(logits, -np.inf, where=~allowed(mask, logits.shape[-1]))
    best = int(logits.argmax())
    return best, bool(np.isfinite(logits[best]))


def draw(logits: np.ndarray, params: SamplingParams, num_output_tokens: int) -> int:
    """logits: [V] float32 → a token drawn under temperature, top-k and top-p. Raises
    `Unsampleable` when the probabilities are not finite."""
    with np.errstate(all="ignore"):  # a temperature that overflows the logits: caught below
        scaled = np.divide(logits, params.temperature, dtype=np.float32)
        probs, ids = candidates(scaled, params.top_k, params.top_p)
    if not np.isfinite(probs).all():
        raise Unsampleable(
            f"the probabilities at temperature {params.temperature:g} are not finite numbers"
        )
    seed = None if params.seed is None else step_seed(params.seed, num_output_tokens)
    # Normalised in float64: `choice` wants a sum of 1, which top-k / top-p survivors lack.
    weights = probs.astype(np.float64)
    choice = int(np.random.default_rng(seed).choice(len(weights), p=weights / weights.sum()))
    return choice if ids is None else int(ids[choice])


def candidates(
    logits: np.ndarray, top_k: int, top_p: float
) -> tuple[np.ndarray, np.ndarray | None]:
    """logits: [V] (temperature applied) → (probabilities, their token ids or None for all).

    Top-k first, then top-p over the renormalised survivors, as transformers and vLLM do. Top-p
    keeps the most likely tokens whose mass before each is below `top_p` (at least one).
    """
    if top_k <= 0 and top_p >= 1.0:
        return _softmax(logits), None
    if top_k > 0:
        ids = _largest(logits, min(top_k, logits.shape[-1]))
        probs = _softmax(logits[ids])
    else:
        full = _softmax(logits)
        ids = _largest(full, min(TOP_P_CANDIDATES, full.shape[-1]))
        if float(full[ids].sum()) < top_p:
            ids = _largest(full, full.shape[-1])
        probs = full[ids]
    if top_p < 1.0:
        keep = max(1, int(((np.cumsum(probs) - probs) < top_p).sum()))
        probs, ids = probs[:keep], ids[:keep]
    return probs, ids


def _largest(values: np.ndarray, k: int) -> np.ndarray:
    """The ids of the `k` largest values, largest first (a partition, then a sort of k only)."""
    ids = np.argpartition(values, -k)[-k:]
    return ids[np.argsort(-values[ids], kind="stable")]


def _softmax(logits: np.ndarray) -> np.ndarray:
    exp = np.exp(logits - logits.max())  # a +inf or all -inf gives NaN: caught as non-finite
    return exp / exp.sum()
