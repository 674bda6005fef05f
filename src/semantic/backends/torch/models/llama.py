"""The Llama family (Llama 3.x, SmolLM2, Mistral), and the skeleton the Qwens, SmolLM3 and Phi-3
share: pre-norm blocks of grouped-query attention and a SwiGLU MLP; rope with Llama 3's, linear,
YaRN or LongRoPE scaling, over the whole head or its first dims (`partial_rotary_factor`), in
the layers that have it (all but SmolLM3's NoPE layers); tied or untied embeddings; Q/K/V and
output biases where `attention_bias` says (or the family); Mistral's sliding window in every
layer where its config sets one."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np

from semantic.backends.torch.attention import LayerAttention
from semantic.backends.torch.models.layers import (
    Attention,
    Block,
    Build,
    DecoderModel,
    FeedForward,
    activation,
)
from semantic.backends.torch.models.rope import Rope
from semantic.backends.torch.models.weights import Weights, decoder
from semantic.models.names import rotary_rows
from semantic.models.q4k import Q4KBlocks


def gated_mlp(w: Weights, index: int) -> FeedForward:
    """A layer's dense MLP, gated by the config's activation (SwiGLU)."""
    return w.gated_mlp(activation(w.build.config.hidden_act))


@dataclass(slots=True, frozen=True)
class Variant:
    """What the families on this skeleton differ in: biases (None: as `attention_bias` says),
    RMSNorms of each head's q and k, and each layer's feed-forward (Qwen3 MoE: experts in
    some layers)."""

    qkv_bias: bool | None = None
    o_bias: bool | None = None
    qk_norms: bool = False
    feed_forward: Callable[[Weights, int], FeedForward] = gated_mlp


def block(w: Weights, index: int, rope: Rope, variant: Variant) -> Block:
    config = w.build.config
    qkv_bias = config.attention_bias if variant.qkv_bias is None else variant.qkv_bias
    o_bias = config.attention_bias if variant.o_bias is None else variant.o_bias
    qkv, o = w.qkv_and_o(qkv_bias=qkv_bias, o_bias=o_bias)
    qk_norms = None
    if variant.qk_norms:
        qk_norms = (w.rms_norm("self_attn.q_norm"), w.rms_norm("self_attn.k_norm"))
    how = LayerAttention(config.head_dim**-0.5, config.layer_window(index))
    layer_rope = rope if config.layer_has_rope(index) else None
    return Block(
        Attention(config, qkv, o, layer_rope, how, w.build.kernels, qk_norms),
        variant.feed_forward(w, index),
        w.rms_norm("input_layernorm"),
        w.rms_norm("post_attention_layernorm"),
    )


def build(
    b: Build, arrays: Iterable[tuple[str, np.ndarray | Q4KBlocks]], variant: Variant = Variant()
) -> DecoderModel:
    config = b.config
    weights = Weights.load(rotary_rows(arrays, config), b)
    rope = Rope(
        config.head_dim, config.rope_theta, config.rope_scaling, b.device, config.rotary_dim
    )
    layers = range(config.num_hidden_layers)
    return decoder(weights, [block(weights.layer(i), i, rope, variant) for i in layers])
