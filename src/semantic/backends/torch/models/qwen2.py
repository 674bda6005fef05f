"""Qwen2 and Qwen2.5 (their coder variants too): Llama's blocks with biases on the Q, K and V
projections (none on the output); tied or untied embeddings; where `use_sliding_window` is set,
a sliding window in the layers from `max_window_layers` on."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from semantic.backends.torch.attention import LayerAttention
from semantic.backends.torch.models.layers import Attention, Block, Build, DecoderModel, activation
from semantic.backends.torch.models.rope import Rope
from semantic.backends.torch.models.weights import Weights, decoder


def block(w: Weights, index: int, rope: Rope) -> Block:
    config = w.build.config
    qkv, o = w.qkv_and_o(qkv_bias=True, o_bias=False)
    how = LayerAttention(config.head_dim**-0.5, config.layer_window(index))
    return Block(
        Attention(config, qkv, o, rope, how),
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
