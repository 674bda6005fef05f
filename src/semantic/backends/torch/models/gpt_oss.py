"""The GPT-OSS skeleton: pre-norm blocks of attention with biases and a sink logit per head
(sliding and global layers alternate, sliding first), YaRN rope, and a mixture of experts: a
router picks the top k experts of each token, whose outputs are summed with the softmax of
their router logits (`experts.py`). Each expert is a clamped SwiGLU variant,
`(up + 1) · gate · σ(α · gate)`, with biases.

Expert weights are kept as one `Linear` per expert and projection, in the model dtype: the
MXFP4 weights of the released checkpoints are dequantized on load (`models/mxfp4.py`, or the
`gguf` package for GGUF files). That costs memory (about 4x the packed size) and keeps every
expert on the same kernels as the rest of the model; a packed MXFP4 kernel is future work.
Our expert names are per projection, `[E, out, in]` (as GGUF stores them); the family's record
(`models/families/gpt_oss.py`) turns the Hugging Face layout into it.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import torch

from semantic.backends.torch.attention import LayerAttention
from semantic.backends.torch.linear import Linear
from semantic.backends.torch.models.experts import Experts, SoftmaxOfTopK
from semantic.backends.torch.models.layers import (
    Attention,
    Block,
    Build,
    DecoderModel,
    FeedForward,
)
from semantic.backends.torch.models.rope import Rope
from semantic.backends.torch.models.weights import Weights, decoder
from semantic.models.families.family import BlockShape


class ClampedSwiGLU:
    """One GPT-OSS expert: `down((up + 1) · gate · σ(α · gate))`, gate and up clamped first."""

    def __init__(self, gate_up: Linear, down: Linear, limit: float, alpha: float) -> None:
        self.gate_up = gate_up
        self.down = down
        self.limit = limit
        self.alpha = alpha

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        # x: [T, D] → [T, D]
        gate, up = self.gate_up(x).chunk(2, dim=-1)  # [T, I] each
        gate = gate.clamp(max=self.limit)
        up = up.clamp(min=-self.limit, max=self.limit)
        return self.down((up + 1) * (gate * torch.sigmoid(gate * self.alpha)))


def experts(w: Weights) -> Experts:
    config, linear = w.build.config, w.build.linear
    prefix = "mlp.experts."
    gate, up = w.take(prefix + "gate_proj.weight"), w.take(prefix + "up_proj.weight")
    gate_b, up_b = w.take(prefix + "gate_proj.bias"), w.take(prefix + "up_proj.bias")
    down, down_b = w.take(prefix + "down_proj.weight"), w.take(prefix + "down_proj.bias")
    each: list[FeedForward] = [
        ClampedSwiGLU(
            linear(torch.cat([gate[e], up[e]]), torch.cat([gate_b[e], up_b[e]])),
            linear(down[e].contiguous(), down_b[e].contiguous()),
            config.swiglu_limit,
            config.swiglu_alpha,
        )
        for e in range(config.num_local_experts)
    ]
    router = linear(w.take("mlp.router.weight"), w.take("mlp.router.bias"))
    return Experts(SoftmaxOfTopK(router, config.num_experts_per_tok), each)


def block(w: Weights, index: int, rope: Rope) -> Block:
    config = w.build.config
    qkv, o = w.qkv_and_o(qkv_bias=True, o_bias=True)
    sinks = w.take("self_attn.sinks").float()
    how = LayerAttention(config.head_dim**-0.5, config.layer_window(index), sinks)
    return Block(
        Attention(config, qkv, o, rope, how, w.build.kernels),
        experts(w),
        w.rms_norm("input_layernorm", scale_in_fp32=True),
        w.rms_norm("post_attention_layernorm", scale_in_fp32=True),
    )


def build(b: Build, arrays: Iterable[tuple[str, np.ndarray]], shape: BlockShape) -> DecoderModel:
    config = b.config
    weights = Weights.load(arrays, b)
    rope = Rope(config.head_dim, config.rope_theta, config.rope_scaling, b.device)
    blocks = [block(weights.layer(i), i, rope) for i in range(config.num_hidden_layers)]
    return decoder(weights, blocks, scale_in_fp32=True)
