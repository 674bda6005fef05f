"""The Llama skeleton, which Llama, the Qwens, SmolLM3 and Phi-3 build: pre-norm blocks of
grouped-query attention and a SwiGLU MLP; rope with Llama 3's, linear, YaRN or LongRoPE
scaling, over the whole head or its first dims (`partial_rotary_factor`), in the layers that
have it (all but SmolLM3's NoPE layers); tied or untied embeddings; Q/K/V and output biases
where the family's `BlockShape` or `attention_bias` says; RMSNorms of each head's q and k
(Qwen3); experts in the sparse layers (Qwen3 MoE); a sliding window where the config says."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from semantic.backends.torch.attention import LayerAttention
from semantic.backends.torch.models.experts import Experts, TopKOfSoftmax
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
from semantic.models.families.family import BlockShape
from semantic.models.names import rotary_rows
from semantic.models.q6k import Blocks


def gated_mlp(w: Weights, index: int) -> FeedForward:
    """A layer's dense MLP, gated by the config's activation (SwiGLU)."""
    return w.gated_mlp(activation(w.build.config.hidden_act))


def experts_or_mlp(w: Weights, index: int) -> FeedForward:
    """Qwen3 MoE's: the layer's experts where it is sparse, else its dense MLP. The router
    `gate` takes the softmax over all experts; each token's top k of it (renormalised where
    `norm_topk_prob` says) weigh their experts, each a SwiGLU MLP."""
    config = w.build.config
    if not config.layer_has_experts(index):
        return gated_mlp(w, index)
    act = activation(config.hidden_act)
    experts: list[FeedForward] = [
        w.gated_mlp(act, prefix=f"mlp.experts.{e}.") for e in range(config.num_local_experts)
    ]
    gate = w.build.linear(w.take("mlp.gate.weight"), None)
    return Experts(TopKOfSoftmax(gate, config.num_experts_per_tok, config.norm_topk_prob), experts)


def block(w: Weights, index: int, rope: Rope, shape: BlockShape) -> Block:
    config = w.build.config
    qkv_bias = config.attention_bias if shape.qkv_bias is None else shape.qkv_bias
    o_bias = config.attention_bias if shape.o_bias is None else shape.o_bias
    qkv, o = w.qkv_and_o(qkv_bias=qkv_bias, o_bias=o_bias)
    qk_norms = None
    if shape.qk_norms:
        qk_norms = (w.rms_norm("self_attn.q_norm"), w.rms_norm("self_attn.k_norm"))
    how = LayerAttention(config.head_dim**-0.5, config.layer_window(index))
    layer_rope = rope if config.layer_has_rope(index) else None
    return Block(
        Attention(config, qkv, o, layer_rope, how, w.build.kernels, qk_norms),
        (experts_or_mlp if shape.experts else gated_mlp)(w, index),
        w.rms_norm("input_layernorm"),
        w.rms_norm("post_attention_layernorm"),
    )


def build(
    b: Build, arrays: Iterable[tuple[str, np.ndarray | Blocks]], shape: BlockShape
) -> DecoderModel:
    config = b.config
    weights = Weights.load(rotary_rows(arrays, config), b)
    rope = Rope(
        config.head_dim, config.rope_theta, config.rope_scaling, b.device, config.rotary_dim
    )
    layers = range(config.num_hidden_layers)
    return decoder(weights, [block(weights.layer(i), i, rope, shape) for i in layers])
