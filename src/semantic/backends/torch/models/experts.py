"""The mixture-of-experts layer of the torch backend: a router picks each token's top k experts
and their weights, by its family's rule, and each chosen expert runs over the tokens that chose
it alone; their outputs are summed with those weights. The experts themselves are the family's
feed-forward (GPT-OSS's clamped SwiGLU, Qwen3 MoE's plain `GatedMLP`)."""

from __future__ import annotations

from typing import Protocol

import torch

from semantic.backends.torch.linear import Linear
from semantic.backends.torch.models.layers import DecoderModel, FeedForward


class Router(Protocol):
    def __call__(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x: [T, D] → each token's chosen experts' weights [T, k] (x's dtype) and ids [T, k]."""
        ...


class SoftmaxOfTopK:
    """GPT-OSS: the top k router logits, their softmax in the model dtype."""

    def __init__(self, gate: Linear, top_k: int) -> None:
        self.gate = gate
        self.top_k = top_k

    def __call__(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        top, chosen = torch.topk(self.gate(x), self.top_k, dim=-1)  # [T, k]
        return torch.softmax(top, dim=-1, dtype=top.dtype), chosen


class TopKOfSoftmax:
    """Qwen3 MoE: the softmax over every expert in fp32, its top k, renormalised to sum to 1
    when `renormalise` (`norm_topk_prob`), then rounded to the model dtype."""

    def __init__(self, gate: Linear, top_k: int, renormalise: bool) -> None:
        self.gate = gate
        self.top_k = top_k
        self.renormalise = renormalise

    def __call__(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        probabilities = torch.softmax(self.gate(x), dim=-1, dtype=torch.float32)  # [T, E]
        top, chosen = torch.topk(probabilities, self.top_k, dim=-1)  # [T, k]
        if self.renormalise:
            top = top / top.sum(dim=-1, keepdim=True)
        return top.to(x.dtype), chosen


class Experts:
    """The MoE layer: the router's choice, then each chosen expert over its own tokens."""

    def __init__(self, router: Router, experts: list[FeedForward]) -> None:
        self.router = router
        self.experts = experts

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        # x: [T, D] → [T, D]
        weights, chosen = self.router(x)  # [T, k] each
        out = torch.zeros_like(x)
        for expert in torch.unique(chosen).tolist():
            rows, slot = torch.where(chosen == expert)
            y = self.experts[expert](x[rows]) * weights[rows, slot, None]
            out.index_add_(0, rows, y.to(out.dtype))
        return out


def routes_on_host(model: DecoderModel) -> bool:
    """Whether a layer of the model picks its experts on the host (`Experts` reads the choice
    back to loop over it): a CUDA graph cannot record that, so such a model decodes eagerly."""
    return any(isinstance(block.mlp, Experts) for block in model.blocks)
