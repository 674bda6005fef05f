"""Picking each next token from fp32 logits: greedy, temperature, top-k, top-p, min_tokens.

A seeded request draws from a generator seeded by (seed, tokens generated so far), so its output
is reproducible whatever it is batched with, and the runner keeps no random state between steps.
A row that cannot be sampled (non-finite logits or probabilities, a value the draw refuses) gets
its error instead of a token, so it fails its own request and never the batch. Probabilities are
checked before `multinomial`, which on CUDA would stop the device instead of raising. A row with
a grammar (structured output) has every token its grammar forbids masked first, and its matcher
takes the token drawn; a row whose grammar fails fails alone too.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np
import torch

from semantic.core import BatchItem, SamplingParams
from semantic.text.grammar import GrammarStates

# Top-p first looks among this many most likely tokens; a nucleus wider than them (rare: a flat
# distribution) falls back to sorting the whole vocabulary.
_TOP_P_CANDIDATES = 1024


class Unsampleable(ValueError):
    """A row whose logits or probabilities are not finite numbers: it has no token to give."""


def sample(
    logits: torch.Tensor, items: Sequence[BatchItem], grammars: GrammarStates | None = None
) -> list[int | Exception]:
    """logits: [N, V] fp32, one row per item → per item, its token id or why it has none.
    `grammars` holds the matchers of the items with a grammar (none: no item has one)."""
    with torch.inference_mode():  # the logits are inference tensors; suppression writes them
        _suppress(logits, items)
        masks, failed = _grammar_masks(items, grammars)
        best = logits.argmax(-1)
        # argmax picks a NaN or +inf where a row has one, and -inf only when all are: so the
        # chosen logit is finite exactly when the row is usable.
        finite = logits.gather(-1, best[:, None]).squeeze(-1).isfinite()
        tokens, usable = torch.stack([best, finite.long()]).tolist()  # one copy to the host
        outcomes: list[int | Exception] = []
        for row, item in enumerate(items):
            mask = masks.get(row)
            if mask is not None and not (item.sampling.greedy and _allows(mask, tokens[row])):
                # A greedy row whose best token the grammar allows needs no mask at all.
                tokens[row], usable[row] = _masked_best(logits[row], mask)
            if row in failed:
                outcomes.append(failed[row])
            elif not usable[row]:
                outcomes.append(Unsampleable("no token the model and its constraints allow"))
            elif item.sampling.greedy:
                outcomes.append(tokens[row])
            else:
                outcomes.append(_draw_or_error(logits[row], item))
    return _advance(grammars, items, outcomes) if masks else outcomes


def _grammar_masks(
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


def _allows(mask: np.ndarray, token: int) -> bool:
    return 0 <= token < mask.shape[0] * 32 and bool((int(mask[token >> 5]) >> (token & 31)) & 1)


def _masked_best(logits: torch.Tensor, mask: np.ndarray) -> tuple[int, bool]:
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


def _advance(
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


def _draw_or_error(logits: torch.Tensor, item: BatchItem) -> int | Exception:
    try:
        return draw(logits, item.sampling, item.num_output_tokens)
    except Exception as exc:  # this row's alone, whatever its cause
        return exc


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
        probs, ids = full.topk(min(_TOP_P_CANDIDATES, full.shape[-1]))
        if float(probs.sum()) < top_p:
            probs, ids = full.sort(descending=True)
    if top_p < 1.0:
        keep = max(1, int(((probs.cumsum(-1) - probs) < top_p).sum()))
        probs, ids = probs[:keep], ids[:keep]
    return probs, ids


def step_seed(seed: int, num_output_tokens: int) -> int:
    """A 63-bit seed for one draw: the same (seed, position) gives the same draw in any process."""
    digest = hashlib.blake2b(f"{seed}:{num_output_tokens}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def _suppress(logits: torch.Tensor, items: Sequence[BatchItem]) -> None:
    # The scheduler names the tokens a request may not end with yet (before min_tokens). An id
    # past the logits (a tokenizer larger than the model's vocabulary) can never be drawn
    # anyway; indexing with it would fail the row, and on CUDA the device.
    vocab = logits.shape[-1]
    for row, item in enumerate(items):
        ids = [token for token in item.suppress_token_ids if 0 <= token < vocab]
        if ids:
            logits[row, ids] = float("-inf")
