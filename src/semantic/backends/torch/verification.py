"""Verifying drafts (speculative decoding): which of a decode's draft tokens the model accepts,
and the token it gives after them, from the logits at the draft's positions.

Each position's logits are first what plain decoding would sample from there: its repetition
penalty counts the draft tokens before it as seen, and its grammar's mask is the matcher's
state after them. A greedy row then accepts a draft token exactly when it is the argmax there,
so its output is token for token what decoding one token a step gives. A sampled row follows
the speculative sampling rule for a draft that is one fixed token (no draft distribution): it
accepts draft token d with probability p(d) under the row's distribution (temperature, top-k,
top-p), and otherwise draws from p with d taken out (renormalized) — each token's probability
stays p's. Rows that draft have no suppressed tokens: the scheduler drafts only past min_tokens.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from semantic.backends.sampling import Unsampleable, penalized_ids, step_seed
from semantic.backends.torch.sampling import candidates, masked_best, penalize, sample
from semantic.core import BatchItem, SamplingParams, TokenLogprob
from semantic.text.grammar import GrammarStates


def sample_or_verify(
    logits: torch.Tensor, items: Sequence[BatchItem], grammars: GrammarStates | None = None
) -> list[int | TokenLogprob | list[int] | Exception]:
    """logits: [R, V] fp32, one row per item, but 1 + k rows for an item with a draft of k
    tokens → per item, its token (`sample`), a draft's accepted tokens and the one after them
    (`verify`), or why it has none."""
    if not any(item.draft_token_ids for item in items):
        return list(sample(logits, items, grammars))
    plain: list[int] = []  # the items that sample one token, and their rows
    plain_rows: list[int] = []
    outcomes: list[int | TokenLogprob | list[int] | Exception] = []
    row = 0
    for index, item in enumerate(items):
        rows = 1 + len(item.draft_token_ids)
        if item.draft_token_ids:
            outcomes.append(verify(logits[row : row + rows], item, grammars))
        else:
            outcomes.append(0)  # replaced below
            plain.append(index)
            plain_rows.append(row)
        row += rows
    if plain:
        sampled = sample(logits[plain_rows], [items[i] for i in plain], grammars)
        for index, outcome in zip(plain, sampled, strict=True):
            outcomes[index] = outcome
    return outcomes


def verify(
    logits: torch.Tensor, item: BatchItem, grammars: GrammarStates | None = None
) -> list[int] | Exception:
    """logits: [1 + k, V] fp32, at a decode token and its k draft tokens → the draft tokens
    accepted, in order, and the token after them; or why the row has none."""
    try:
        with torch.inference_mode():  # the logits are inference tensors; the penalty writes them
            _penalize(logits, item)
            constrained = grammars is not None and item.sampling.grammar is not None
            if item.sampling.greedy and not constrained:
                return _verify_greedy(logits, item.draft_token_ids)
            return _verify_stepwise(logits, item, grammars if constrained else None)
    except Exception as exc:  # this row's alone, whatever its cause
        return exc


def _penalize(logits: torch.Tensor, item: BatchItem) -> None:
    """Each row's repetition penalty as plain decoding applies it at that position: the draft
    tokens before the row count as seen. A row is read only when they were all accepted."""
    for row in range(logits.shape[0]):
        ids = penalized_ids(item, logits.shape[-1], drafted=row)
        penalize(logits[row], ids, item.sampling.repetition_penalty)


def _verify_greedy(logits: torch.Tensor, draft: tuple[int, ...]) -> list[int]:
    best = logits.argmax(-1)
    # The argmax's logit is finite exactly when the row is usable (`sample` says why).
    finite = logits.gather(-1, best[:, None]).squeeze(-1).isfinite()
    tokens, usable = torch.stack([best, finite.long()]).tolist()  # one copy to the host
    run: list[int] = []
    for token, ok, drafted in zip(tokens, usable, (*draft, None), strict=True):
        if not ok:
            raise Unsampleable("no token the model allows")
        run.append(token)
        if token != drafted:
            break
    return run


def _verify_stepwise(
    logits: torch.Tensor, item: BatchItem, grammars: GrammarStates | None
) -> list[int]:
    """A sampled row, or one with a grammar, one position at a time: a grammar's mask at a
    position is its state after the draft tokens accepted before it, so its matcher takes
    each token of the run as it is chosen (and only those)."""
    run: list[int] = []
    for row, drafted in enumerate((*item.draft_token_ids, None)):
        position = item.num_output_tokens + row
        if grammars is not None:
            _constrain(logits[row], item, position, grammars)
        token = _choose(logits[row], item.sampling, position, drafted)
        if grammars is not None and (error := grammars.accept(item.seq_id, token)) is not None:
            raise error
        run.append(token)
        if token != drafted:
            break
    return run


def _constrain(
    logits: torch.Tensor, item: BatchItem, position: int, grammars: GrammarStates
) -> None:
    """logits: [V] → every token the row's grammar forbids at `position` set to -inf, in place."""
    mask, errors = grammars.bitmask([(item.seq_id, item.sampling.grammar, position)])
    if errors:
        raise errors[0]
    masked_best(logits, mask[0])


def _choose(
    logits: torch.Tensor, params: SamplingParams, position: int, drafted: int | None
) -> int:
    """logits: [V] at output `position` → the draft token there (`drafted`) when accepted,
    else the token given in its place; after the draft (`drafted` None), the next token."""
    if params.greedy:
        best = int(logits.argmax())
        if not bool(logits[best].isfinite()):
            raise Unsampleable("no token the model and its constraints allow")
        return best
    probs, ids = _distribution(logits, params)
    generator = _generator(logits.device, params.seed, position)
    if drafted is not None:
        at = _position(ids, drafted)
        # Its share of what top-p kept (`candidates` does not renormalise after the cut, and
        # `multinomial` needs no sum of 1): a draft top-p keeps alone is always accepted.
        chance = 0.0 if at is None else float(probs[at] / probs.sum())
        if float(torch.rand(1, generator=generator, device=logits.device)) < chance:
            return drafted
        if at is not None:  # the rest of p, without the rejected token
            probs = probs.clone()
            probs[at] = 0
    return _draw(probs, ids, generator)


def _distribution(
    logits: torch.Tensor, params: SamplingParams
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """logits: [V] → the row's probabilities as `draw` takes them, and their ids (`candidates`)."""
    probs, ids = candidates(logits / params.temperature, params.top_k, params.top_p)
    if not bool(probs.isfinite().all()):
        raise Unsampleable(
            f"the probabilities at temperature {params.temperature:g} are not finite numbers"
        )
    return probs, ids


def _position(ids: torch.Tensor | None, token: int) -> int | None:
    """Where `token` sits among the candidates (`ids` None: every token, in order), None when
    top-k or top-p left it out."""
    if ids is None:
        return token
    found = (ids == token).nonzero()
    return int(found[0, 0]) if found.numel() else None


def _draw(probs: torch.Tensor, ids: torch.Tensor | None, generator: torch.Generator | None) -> int:
    choice = torch.multinomial(probs, 1, generator=generator)
    return int(choice) if ids is None else int(ids[choice])


def _generator(device: torch.device, seed: int | None, position: int) -> torch.Generator | None:
    """A seeded request's draws at each output position come from their own stream (`draw`)."""
    if seed is None:
        return None
    generator = torch.Generator(device)
    generator.manual_seed(step_seed(seed, position))
    return generator
