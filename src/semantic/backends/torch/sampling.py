"""Picking each next token from fp32 logits: greedy, temperature, top-k, top-p, min_tokens.

A seeded request draws from a generator seeded by (seed, tokens generated so far), so its output
is reproducible whatever it is batched with, and the runner keeps no random state between steps.
A row that cannot be sampled (non-finite logits or probabilities, a value the draw refuses) gets
its error instead of a token, so it fails its own request and never the batch. Probabilities are
checked before `multinomial`, which on CUDA would stop the device instead of raising. A row with
a grammar (structured output) has every token its grammar forbids masked first, and its matcher
takes the token drawn; a row whose grammar fails fails alone too. A row whose request asks for
log probabilities gets them from its logits as the model gave them (`_Logprobs`), the others
cost nothing more.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

import numpy as np
import torch

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
from semantic.text.grammar import GrammarStates

__all__ = ["Unsampleable", "candidates", "draw", "masked_best", "penalize", "sample"]


def sample(
    logits: torch.Tensor, items: Sequence[BatchItem], grammars: GrammarStates | None = None
) -> list[int | TokenLogprob | Exception]:
    """logits: [N, V] fp32, one row per item → per item, its token id (a `TokenLogprob` where
    its request asks for log probabilities) or why it has none. `grammars` holds the matchers
    of the items with a grammar (none: no item has one)."""
    with torch.inference_mode():  # the logits are inference tensors; suppression writes them
        logprobs = _Logprobs.of(logits, items)  # before anything below writes the logits
        outcomes = _tokens(logits, items, grammars)
        return list(outcomes) if logprobs is None else logprobs.attach(outcomes, items)


def _tokens(
    logits: torch.Tensor, items: Sequence[BatchItem], grammars: GrammarStates | None
) -> list[int | Exception]:
    """Each row's token id or why it has none (`sample`, without log probabilities; under its
    inference mode)."""
    _penalize(logits, items)
    _suppress(logits, items)
    masks, failed = grammar_masks(items, grammars)
    best = logits.argmax(-1)
    # argmax picks a NaN or +inf where a row has one, and -inf only when all are: so the
    # chosen logit is finite exactly when the row is usable.
    finite = logits.gather(-1, best[:, None]).squeeze(-1).isfinite()
    tokens, usable = torch.stack([best, finite.long()]).tolist()  # one copy to the host
    outcomes: list[int | Exception] = []
    for row, item in enumerate(items):
        mask = masks.get(row)
        if mask is not None and not (item.sampling.greedy and allows(mask, tokens[row])):
            # A greedy row whose best token the grammar allows needs no mask at all.
            tokens[row], usable[row] = masked_best(logits[row], mask)
        drawn = partial(_draw_row, logits, row, item)  # indexes the row only if it draws
        outcomes.append(row_outcome(tokens[row], usable[row], item, drawn, failed.get(row)))
    return advance(grammars, items, outcomes) if masks else outcomes


class _Logprobs:
    """The rows that ask for log probabilities, copied from the logits as the model gave them
    (`raw`: [R, V]), their log-normaliser and their `k` likeliest tokens, kept on the device
    until the step's tokens are known; then one copy of what they asked to the host. (A log
    probability is the logit less the row's logsumexp: no [R, V] log-softmax is written.)"""

    def __init__(self, rows: list[int], raw: torch.Tensor, k: int) -> None:
        self.rows, self.raw = rows, raw
        self.norm = raw.logsumexp(-1, keepdim=True)  # [R, 1]
        self.top = raw.topk(min(k, raw.shape[-1])) if k else None

    @classmethod
    def of(cls, logits: torch.Tensor, items: Sequence[BatchItem]) -> _Logprobs | None:
        rows, k = logprob_rows(items)
        if not rows:
            return None
        index = torch.tensor(rows, device=logits.device)
        return cls(rows, logits.index_select(0, index), k)

    def attach(
        self, outcomes: list[int | Exception], items: Sequence[BatchItem]
    ) -> list[int | TokenLogprob | Exception]:
        tokens = [o if isinstance(o, int) else 0 for o in (outcomes[r] for r in self.rows)]
        index = torch.tensor(tokens, device=self.raw.device)[:, None]
        chosen = (self.raw.gather(-1, index) - self.norm).squeeze(-1).tolist()
        top: list[list[tuple[int, float]]] = [[] for _ in self.rows]
        if self.top is not None:
            values, ids = self.top
            rows = zip(ids.tolist(), (values - self.norm).tolist(), strict=True)
            top = [list(zip(i, v, strict=True)) for i, v in rows]
        return with_logprobs(outcomes, items, self.rows, chosen, top)


def masked_best(logits: torch.Tensor, mask: np.ndarray) -> tuple[int, bool]:
    """logits: [V] → every token the mask forbids set to -inf (in place: a draw reads them), and
    the best token left, with whether it is finite. On the CPU in numpy: for one row that is
    far quicker than a trip through torch's thread pool."""
    allowed = np.unpackbits(mask.view(np.uint8), bitorder="little")[: logits.shape[-1]]
    if logits.device.type == "cpu":
        np.copyto(logits.numpy(), -np.inf, where=allowed == 0)
    else:
        forbidden = torch.from_numpy(allowed == 0).to(logits.device, non_blocking=True)
        logits.masked_fill_(forbidden, float("-inf"))
    best = int(logits.argmax())
    return best, bool(torch.isfinite(logits[best]))


def _draw_row(logits: torch.Tensor, row: int, item: BatchItem) -> int:
    return draw(logits[row], item.sampling, item.num_output_tokens)


def draw(logits: torch.Tensor, params: SamplingParams, num_output_tokens: int) -> int:
    """logits: [V] fp32 → a token drawn under temperature, top-k and top-p. Raises
    `Unsampleable` when the probabilities are not finite."""
    probs, ids = candidates(logits / params.temperature, params.top_k, params.top_p)
    if not bool(probs.isfinite().all()):
        raise Unsampleable(
            f"the probabilities at temperature {params.temperature:g} are not finite numbers"
        )
    generator = None
    if params.seed is not None:
        generator = torch.Generator(logits.device)
        generator.manual_seed(step_seed(params.seed, num_output_tokens))
    choice = torch.multinomial(probs, 1, generator=generator)
    return int(choice) if ids is None else int(ids[choice])


def candidates(
    logits: torch.Tensor, top_k: int, top_p: float
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """logits: [V] (temperature applied) → (probabilities, their token ids or None for all).

    Top-k first, then top-p over the renormalised survivors, as transformers and vLLM do. Top-p
    keeps the most likely tokens whose mass before each is below `top_p` (at least one).
    """
    if top_k <= 0 and top_p >= 1.0:
        return logits.softmax(-1), None
    if top_k > 0:
        values, ids = logits.topk(min(top_k, logits.shape[-1]))
        probs = values.softmax(-1)
    else:
        full = logits.softmax(-1)
        probs, ids = full.topk(min(TOP_P_CANDIDATES, full.shape[-1]))
        if float(probs.sum()) < top_p:
            probs, ids = full.sort(descending=True)
    if top_p < 1.0:
        keep = max(1, int(((probs.cumsum(-1) - probs) < top_p).sum()))
        probs, ids = probs[:keep], ids[:keep]
    return probs, ids


def _penalize(logits: torch.Tensor, items: Sequence[BatchItem]) -> None:
    for row, item in enumerate(items):
        penalize(
            logits[row], penalized_ids(item, logits.shape[-1]), item.sampling.repetition_penalty
        )


def penalize(logits: torch.Tensor, ids: np.ndarray | None, penalty: float) -> None:
    """logits: [V] → the logit of each id in `ids` (the tokens seen) lowered by `penalty`, in
    place: divided where positive, multiplied where negative (transformers' rule)."""
    if ids is None or not len(ids):
        return
    index = torch.from_numpy(ids).to(logits.device)
    seen = logits[index]
    logits[index] = torch.where(seen > 0, seen / penalty, seen * penalty)


def _suppress(logits: torch.Tensor, items: Sequence[BatchItem]) -> None:
    for row, item in enumerate(items):
        ids = suppressed_ids(item, logits.shape[-1])
        if ids:
            logits[row, ids] = float("-inf")
