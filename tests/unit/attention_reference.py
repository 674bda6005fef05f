"""The reference every paged attention kernel is tested against: attention written out in fp32
over keys already gathered in sequence order, with windows and sinks as transformers has them."""

from __future__ import annotations

import torch


def windowed_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    positions: list[int],
    scale: float,
    window: int | None,
    sinks: torch.Tensor | None,
) -> torch.Tensor:
    """Queries q [n, H, D] at `positions` over keys k, v [S, KVH, D] (positions 0..S-1), each
    over its window (or every key up to itself), a head's sink logit joining the softmax
    with no value; fp32, as transformers computes it."""
    heads, kv_heads = q.shape[1], k.shape[1]
    k = k.float().repeat_interleave(heads // kv_heads, 1)
    v = v.float().repeat_interleave(heads // kv_heads, 1)
    scores = torch.einsum("qhd,khd->hqk", q.float(), k) * scale
    query, key = torch.tensor(positions)[:, None], torch.arange(k.shape[0])[None]
    visible = (key <= query) & (key > query - (window or k.shape[0] + 1))
    scores = scores.masked_fill(~visible, float("-inf"))
    if sinks is not None:
        column = sinks.float().view(heads, 1, 1).expand(heads, len(positions), 1)
        scores = torch.cat([scores, column], -1)
    weights = scores.softmax(-1)[..., : k.shape[0]]
    return torch.einsum("hqk,khd->qhd", weights, v)
