"""Rotary position embeddings in Hugging Face's half-split layout, over the inverse frequencies of
`models/rope.py` (the scalings every backend shares)."""

from __future__ import annotations

from typing import Any

import torch

from semantic.models.rope import rope_frequencies


class Rope:
    """One rotary embedding: its inverse frequencies and the factor on each one's cos and sin
    (YaRN's and LongRoPE's; 1 on the dims partial rotary passes through, whose frequency is 0).

    `tables` gives a step's cos and a signed sin (`[-sin, sin]`), so that rotating is
    x·cos + swap_halves(x)·sin_signed: one flip instead of rotate_half's slice-negate-cat. A
    model with two ropes (Gemma 3's sliding and global layers) computes each once per step.
    """

    def __init__(
        self,
        head_dim: int,
        theta: float,
        scaling: dict[str, Any] | None,
        device: torch.device,
        rotary_dim: int | None = None,
    ) -> None:
        inv_freq, factors = rope_frequencies(head_dim, theta, scaling, rotary_dim)
        self.inv_freq = torch.from_numpy(inv_freq).to(device)  # [D/2] fp32
        scaled = (factors != 1.0).any()
        self.factors = torch.from_numpy(factors).to(device) if scaled else None  # [D/2] fp32

    def tables(
        self, positions: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # positions: [T] → cos, sin_signed: [T, 1, D]
        freqs = positions[:, None].float() * self.inv_freq  # [T, D/2]
        cos, sin = freqs.cos(), freqs.sin()
        if self.factors is not None:
            cos, sin = cos * self.factors, sin * self.factors
        cos = torch.cat([cos, cos], -1).to(dtype)
        sin = torch.cat([-sin, sin], -1).to(dtype)
        return cos[:, None], sin[:, None]


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor) -> torch.Tensor:
    # x: [T, N, D]; cos, sin_signed: [T, 1, D]
    swapped = x.unflatten(-1, (2, -1)).flip(-2).flatten(-2)  # [x2, x1]
    return torch.addcmul(x * cos, swapped, sin_signed)
