"""The mixture-of-experts layer of the MLX backend, as the torch backend's
(`backends/torch/models/experts.py`): a router picks each token's top k experts and their
weights by its family's rule, and each chosen expert runs over the tokens that chose it alone.
Which tokens chose which expert is read on the host (MLX has no data-dependent shapes). The
experts are GPT-OSS's clamped SwiGLU (`ClampedSwiGLU`) or Qwen3 MoE's plain `GatedMLP`."""

from __future__ import annotations

from typing import Protocol

import mlx.core as mx
import numpy as np

from semantic.backends.mlx.layers import FeedForward, Linear


class Router(Protocol):
    def __call__(self, x: mx.array) -> tuple[mx.array, mx.array]:
        """x: [T, D] → each token's chosen experts' weights [T, k] (x's dtype) and ids [T, k]."""
        ...


class SoftmaxOfTopK:
    """GPT-OSS: the top k router logits, their softmax in the model dtype."""

    def __init__(self, gate: Linear, top_k: int) -> None:
        self.gate = gate
        self.top_k = top_k

    def __call__(self, x: mx.array) -> tuple[mx.array, mx.array]:
        logits = self.gate(x)  # [T, E]
        chosen = _top_k(logits, self.top_k)
        return mx.softmax(mx.take_along_axis(logits, chosen, axis=-1), axis=-1), chosen


class TopKOfSoftmax:
    """Qwen3 MoE: the softmax over every expert in fp32, its top k, renormalised to sum to 1
    when `renormalise` (`norm_topk_prob`), then rounded to the model dtype."""

    def __init__(self, gate: Linear, top_k: int, renormalise: bool) -> None:
        self.gate = gate
        self.top_k = top_k
        self.renormalise = renormalise

    def __call__(self, x: mx.array) -> tuple[mx.array, mx.array]:
        probabilities = mx.softmax(self.gate(x).astype(mx.float32), axis=-1)  # [T, E]
        chosen = _top_k(probabilities, self.top_k)
        top = mx.take_along_axis(probabilities, chosen, axis=-1)
        if self.renormalise:
            top = top / top.sum(axis=-1, keepdims=True)
        return top.astype(x.dtype), chosen


def _top_k(scores: mx.array, k: int) -> mx.array:
    # scores: [T, E] → the ids of each row's k largest, in no order: [T, k]
    return mx.argpartition(-scores, k - 1, axis=-1)[:, :k]


class ClampedSwiGLU:
    """One GPT-OSS expert: `down((up + 1) · gate · σ(α · gate))`, gate and up clamped first."""

    def __init__(self, gate_up: Linear, down: Linear, limit: float, alpha: float) -> None:
        self.gate_up = gate_up
        self.down = down
        self.limit = limit
        self.alpha = alpha

    def __call__(self, x: mx.array) -> mx.array:
        gate, up = mx.split(self.gate_up(x), 2, axis=-1)  # [T, I] each
        gate = mx.minimum(gate, self.limit)
        up = mx.clip(up, -self.limit, self.limit)
        return self.down((up + 1) * (gate * mx.sigmoid(gate * self.alpha)))


class Experts:
    """The MoE layer: the router's choice, then each chosen expert over its own tokens."""

    def __init__(self, router: Router, experts: list[FeedForward]) -> None:
        self.router = router
        self.experts = experts

    def __call__(self, x: mx.array) -> mx.array:
        # x: [T, D] → [T, D]
        weights, chosen = self.router(x)  # [T, k] each
        out = mx.zeros_like(x)
        choices = np.array(chosen)
        for expert in np.unique(choices).tolist():
            rows, slots = (mx.array(i.astype(np.int32)) for i in np.nonzero(choices == expert))
            y = self.experts[expert](x[rows]) * weights[rows, slots][:, None]
            out = out.at[rows].add(y.astype(out.dtype))
        return out
