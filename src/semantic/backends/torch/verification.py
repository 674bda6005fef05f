"""Verifying drafts (speculative decoding): which of a decode's draft tokens the model accepts,
and the token it gives after them, from the logits at the draft's positions.

A greedy row accepts a draft token exactly when it is the argmax there, so its output is token
for token what decoding one token a step gives. A sampled row follows the speculative sampling
rule for a draft that is one fixed token (no draft distribution): it accepts draft token d with
probability p(d) under the row's distribution (temperature, top-k, top-p), and otherwise draws
from p with d taken out (renormalized) — each token's probability stays p's. Rows that draft
have no grammar, repetition penalty or suppressed tokens: the scheduler never drafts for them.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from semantic.backends.sampling import Unsampleable, step_seed
from semantic.backends.torch.sampling import candidates, sample
from semantic.core import BatchItem, SamplingParams
from semantic.text.grammar import GrammarStates


def sample_or_verify(
    logits: torch.Tensor, items: Sequence[BatchItem], grammars: GrammarStates | None = None
) -> list[int | list[int] | Exception]:
    """logits: [R, V] fp32, one row per item, but 1 + k rows for an item with a draft of k
    tokens → per item, its token (`sample`), a draft's accepted tokens and the one after them
    (`verify`), or why it has none."""
    if not any(item.draft_token_ids for item in items):
        return list(sample(logits, items, grammars))
    plain: list[int] = []  # the items that sample one token, and their rows
    plain_rows: list[int] = []
    outcomes: list[int | list[int] | Exception] = []
    row = 0
    for index, item in enumerate(items):
        rows = 1 + len(item.draft_token_ids)
        if item.draft_token_ids:
            outcomes.append(verify(logits[row : row + rows], item))
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


def verify(logits: torch.Tensor, item: BatchItem) -> list[int] | Exception:
    """logits: [1 + k, V] fp32, at a decode token and its k draft tokens → the draft tokens
    accepted, in order, and the token after them; or why the row has none."""
    try:
        if item.sampling.greedy:
            return _verify_greedy(logits, item.draft_token_ids)
        return _verify_sampled(logits, item.draft_token_ids, item.sampling, item.num_output_tokens)
    except Exception as exc:  # this row's alone, whatever its cause
        return exc


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


def _verify_sampled(
    logits: torch.Tensor, draft: tuple[int, ...], params: SamplingParams, num_output_tokens: int
) -> list[int]:
    run: list[int] = []
    for row, drafted in enumerate(draft):
        probs, ids = _distribution(logits[row], params)
        generator = _generator(logits.device, params.seed, num_output_tokens + row)
        at = _position(ids, drafted)
        chance = 0.0 if at is None else float(probs[at])
        if float(torch.rand(1, generator=generator, device=logits.device)) < chance:
            run.append(drafted)
            continue
        if at is not None:  # the rest of p, without the rejected token
            probs = probs.clone()
            probs[at] = 0
        return [*run, _draw(probs, ids, generator)]
    # Every draft token accepted: the token after them, from the last row.
    probs, ids = _distribution(logits[len(draft)], params)
    generator = _generator(logits.device, params.seed, num_output_tokens + len(draft))
    return [*run, _draw(probs, ids, generator)]


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
