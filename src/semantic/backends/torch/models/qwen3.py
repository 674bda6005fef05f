"""Qwen3 (dense): Llama's blocks with an RMSNorm over each head's query and key before rope
(`q_norm`, `k_norm`), no biases unless `attention_bias`, head_dim set apart from hidden_size.
`<think>` blocks are plain text to the model; the APIs map them."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from semantic.backends.torch.attention import LayerAttention
from semantic.backends.torch.models.layers import Attention, Block, Build, DecoderModel, activation
from semantic.backends.torch.models.rope import Rope
from semantic.backends.torch.models.weights import Weights, decoder


def block(w: Weights, index: int, rope: Rope) -> Block:
    config = w.build.config
    qkv, o = w.qkv_and_o(qkv_bias=config.attention_bias, o_bias=config.attention_bias)
    qk_norms = (w.rms_norm("self_attn.q_norm"), w.rms_norm("self_attn.k_norm"))
    how = LayerAttention(config.head_dim**-0.5, config.layer_window(index))
    return Block(
        Attention(config, qkv, o, rope, how, qk_norms),
        w.gated_mlp(activation(config.hidden_act)),
        w.rms_norm("input_layernorm"),
        w.rms_norm("post_attention_layernorm"),
    )


def build(b: Build, arrays: Iterable[tuple[str, np.ndarray]]) -> DecoderModel:
    config = b.config
    weights = Weights.load(arrays, b)
    rope = Rope(config.head_dim, config.rope_theta, config.rope_scaling, b.device)
    return decoder(
        weights, [block(weights.layer(i), i, rope) for i in range(config.num_hidden_layers)]
    )
