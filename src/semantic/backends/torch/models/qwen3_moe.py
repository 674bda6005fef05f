"""Qwen3 MoE (Qwen3-30B-A3B, Qwen3-Coder-30B-A3B): Qwen3's attention (q/k norms, head_dim apart
from hidden_size) with a mixture of experts in place of the MLP in every sparse layer
(`ModelConfig.layer_has_experts`): the router `gate` takes the softmax over all experts, each
token's top k of it (renormalised where `norm_topk_prob` says) weigh their experts, each a plain
SwiGLU MLP of `moe_intermediate_size`. The other layers keep a dense SwiGLU MLP.

Experts are named per expert, as the released checkpoints store them
(`mlp.experts.<e>.gate_proj.weight`); `models/names.py` splits transformers' fused tensors and
GGUF's stacked ones into those names.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

import numpy as np

from semantic.backends.torch.models import llama, qwen3
from semantic.backends.torch.models.experts import Experts, TopKOfSoftmax
from semantic.backends.torch.models.layers import Build, DecoderModel, FeedForward, activation
from semantic.backends.torch.models.weights import Weights
from semantic.models.names import qwen3_moe_experts_split


def feed_forward(w: Weights, index: int) -> FeedForward:
    """The layer's experts where it is sparse, else its dense MLP."""
    config = w.build.config
    if not config.layer_has_experts(index):
        return llama.gated_mlp(w, index)
    act = activation(config.hidden_act)
    experts: list[FeedForward] = [
        w.gated_mlp(act, prefix=f"mlp.experts.{e}.") for e in range(config.num_local_experts)
    ]
    gate = w.build.linear(w.take("mlp.gate.weight"), None)
    return Experts(TopKOfSoftmax(gate, config.num_experts_per_tok, config.norm_topk_prob), experts)


VARIANT = replace(qwen3.VARIANT, feed_forward=feed_forward)


def build(b: Build, arrays: Iterable[tuple[str, np.ndarray]]) -> DecoderModel:
    return llama.build(b, qwen3_moe_experts_split(arrays), VARIANT)
