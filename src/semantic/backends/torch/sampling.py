"""Picking each next token from fp32 logits: greedy, temperature, top-k, top-p, min_tokens.

A seeded request draws from a generator seeded by (seed, tokens generated so far), so its output
is reproducible whatever it is batched with, and the runner keeps no random state between steps.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import torch

from semantic.core import BatchItem, SamplingParams

# Top-p first looks among this many most likely tokens; a nucleus wider than them (rare: a flat
# distribution) falls back to sorting the whole vocabulary.
_TOP_P_CANDIDATES = 1024


def sample(logits: torch.Tensor, items: Sequence[BatchItem]) -> list[int]:
    """logits: [N, V] fp32, one row per item → one token id per item."""
    with torch.inference_mode():  # the logits are inference tensors; suppression writes them
        _suppress(logits, items)
        tokens: list[int] = logits.argmax(-1).tolist()
        for row, item in enumerate(items):
            if not item.sampling.greedy:
                tokens[row] = draw(logits[row], item.sampling, item.num_output_tokens)
    return tokens


def draw(logits: torch.Tensor, params: SamplingParams, num_output_tokens: int) -> int:
    """logits: [V] fp32 → a token drawn under temperature, top-k and top-p."""
    probs, ids = candidates(logits / params.temperature, params.top_k, params.top_p)
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
    # The scheduler names the tokens a request may not end with yet (before min_tokens).
    for row, item in enumerate(items):
        if item.suppress_token_ids:
            logits[row, list(item.suppress_token_ids)] = float("-inf")
