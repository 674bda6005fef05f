"""The MLX backend's model builders, one per block skeleton a family's record names
(`models/families/`: `BlockShape.skeleton`), as the torch backend's (`backends/torch/models/`),
in MLX's layers (`layers.py`): Llama's (which Llama, SmolLM2, Mistral, SmolLM3, the Qwens and
Phi-3 build, with the options of their `BlockShape`), Gemma 3's (four norms a block, GeGLU,
sliding and global layers with their own ropes) and GPT-OSS's (sinks, biases, alternating
windows, experts). The family's record applies its weight-name fix-ups first.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from semantic.backends.mlx.attention import LayerAttention
from semantic.backends.mlx.experts import ClampedSwiGLU, Experts, SoftmaxOfTopK, TopKOfSoftmax
from semantic.backends.mlx.layers import (
    Attention,
    Block,
    DecoderModel,
    FeedForward,
    GatedMLP,
    Linear,
    RMSNorm,
    Rope,
    activation,
    linear,
)
from semantic.errors import ModelLoadFailed
from semantic.models.config import ModelConfig
from semantic.models.families import family_of, supported_model_types
from semantic.models.families.family import BlockShape
from semantic.models.names import rotary_rows


@dataclass(slots=True, frozen=True)
class Build:
    """What every family's builder needs besides the weights."""

    config: ModelConfig
    dtype: mx.Dtype
    weight_format: str  # "bf16" (the dtype) or "int8" (`layers.linear`)


class Weights:
    """The checkpoint's arrays by Hugging Face name, each taken once by the layer that owns it;
    any left at the end is an error, so a checkpoint of another architecture never loads
    half-used. `layer(i)` sees the same store from `model.layers.<i>.`."""

    def __init__(self, arrays: dict[str, mx.array], build: Build, prefix: str = "") -> None:
        self._arrays = arrays
        self.build = build
        self.prefix = prefix

    @classmethod
    def load(
        cls,
        arrays: Iterable[tuple[str, np.ndarray]],
        build: Build,
        rename: Callable[[str], str | None] | None = None,
    ) -> Weights:
        """The checkpoint's arrays, each converted to the model's dtype as it arrives (so the
        fp32 copies never all live at once); those `rename` maps to None skipped."""
        converted = {}
        for name, array in arrays:
            renamed = rename(name) if rename is not None else name
            if renamed is None or renamed.endswith("rotary_emb.inv_freq"):
                continue
            converted[renamed] = mx.array(array).astype(build.dtype)
            mx.eval(converted[renamed])
        return cls(converted, build)

    def take(self, name: str) -> mx.array:
        try:
            return self._arrays.pop(self.prefix + name)
        except KeyError:
            raise ModelLoadFailed(f"checkpoint lacks weight {self.prefix}{name}") from None

    def take_optional(self, name: str) -> mx.array | None:
        return self.take(name) if self.prefix + name in self._arrays else None

    def layer(self, index: int) -> Weights:
        return Weights(self._arrays, self.build, f"{self.prefix}model.layers.{index}.")

    def check_all_taken(self) -> None:
        if self._arrays:
            raise ModelLoadFailed(f"unexpected weights: {sorted(self._arrays)[:20]}")

    def linear(self, weight: mx.array, bias: mx.array | None = None) -> Linear:
        return linear(weight, bias, self.build.weight_format)

    def rms_norm(self, name: str, offset: float = 0.0) -> RMSNorm:
        weight = self.take(f"{name}.weight")
        if offset:  # Gemma's (1 + w), in fp32 before rounding to the dtype
            weight = (weight.astype(mx.float32) + offset).astype(self.build.dtype)
        return RMSNorm(weight, self.build.config.rms_norm_eps)

    def qkv_and_o(self, qkv_bias: bool, o_bias: bool) -> tuple[Linear, Linear]:
        """Q, K and V fused into one linear, and the output projection."""
        weight = mx.concatenate([self.take(f"self_attn.{p}_proj.weight") for p in "qkv"])
        bias = None
        if qkv_bias:
            bias = mx.concatenate([self.take(f"self_attn.{p}_proj.bias") for p in "qkv"])
        o = self.take("self_attn.o_proj.weight")
        o_b = self.take("self_attn.o_proj.bias") if o_bias else None
        return self.linear(weight, bias), self.linear(o, o_b)

    def gated_mlp(self, act_name: str, prefix: str = "mlp.") -> GatedMLP:
        gate, up = self.take(f"{prefix}gate_proj.weight"), self.take(f"{prefix}up_proj.weight")
        gate_up = self.linear(mx.concatenate([gate, up]))
        down = self.linear(self.take(f"{prefix}down_proj.weight"))
        return GatedMLP(gate_up, down, activation(act_name))


def decoder(
    weights: Weights,
    blocks: list[Block],
    embed_scale: float | None = None,
    norm_offset: float = 0.0,
) -> DecoderModel:
    """The model around its blocks: embeddings, final norm and LM head, every weight used.
    Tied, one linear is both (its rows are the embeddings: an 8-bit one widens those it
    gives); untied, the embedding table stays dense."""
    table = weights.take("model.embed_tokens.weight")
    untied = weights.take_optional("lm_head.weight")
    if weights.build.config.tie_word_embeddings:
        embed = head = weights.linear(table)
    elif untied is None:
        raise ModelLoadFailed("checkpoint lacks weight lm_head.weight")
    else:
        embed, head = Linear(table, None), weights.linear(untied)
    norm = weights.rms_norm("model.norm", norm_offset)
    weights.check_all_taken()
    return DecoderModel(embed, blocks, norm, head, embed_scale)


def _gated_mlp(w: Weights, index: int) -> FeedForward:
    return w.gated_mlp(w.build.config.hidden_act)


def _llama(b: Build, arrays: Iterable[tuple[str, np.ndarray]], shape: BlockShape) -> DecoderModel:
    """Llama, SmolLM2, Mistral, SmolLM3 (rope-less in the layers its config says); the Qwens
    are its blocks with other options, Phi-3 under other names. Rope over each head's first
    `rotary_dim` dims, q and k reordered for it."""
    config = b.config
    weights = Weights.load(rotary_rows(arrays, config), b)
    rope = Rope(config.head_dim, config.rope_theta, config.rope_scaling, config.rotary_dim)
    layers = range(config.num_hidden_layers)
    return decoder(weights, [_llama_block(weights.layer(i), i, rope, shape) for i in layers])


def _llama_block(w: Weights, index: int, rope: Rope, shape: BlockShape) -> Block:
    config = w.build.config
    qkv_bias = config.attention_bias if shape.qkv_bias is None else shape.qkv_bias
    o_bias = config.attention_bias if shape.o_bias is None else shape.o_bias
    qk_norms = None
    if shape.qk_norms:
        qk_norms = (w.rms_norm("self_attn.q_norm"), w.rms_norm("self_attn.k_norm"))
    how = LayerAttention(config.head_dim**-0.5, config.layer_window(index))
    layer_rope = rope if config.layer_has_rope(index) else None
    attention = Attention(config, index, w.qkv_and_o(qkv_bias, o_bias), layer_rope, how, qk_norms)
    norms = (w.rms_norm("input_layernorm"), w.rms_norm("post_attention_layernorm"))
    feed_forward = _experts_or_mlp if shape.experts else _gated_mlp
    return Block(attention, feed_forward(w, index), norms)


def _experts_or_mlp(w: Weights, index: int) -> FeedForward:
    """Qwen3 MoE's: the softmax over all experts, its top k (renormalised where
    `norm_topk_prob` says), each expert a SwiGLU MLP; a dense MLP in the layers without
    experts."""
    config = w.build.config
    if not config.layer_has_experts(index):
        return _gated_mlp(w, index)
    experts: list[FeedForward] = [
        w.gated_mlp(config.hidden_act, f"mlp.experts.{e}.") for e in range(config.num_local_experts)
    ]
    gate = w.linear(w.take("mlp.gate.weight"))
    return Experts(TopKOfSoftmax(gate, config.num_experts_per_tok, config.norm_topk_prob), experts)


def _gemma3(b: Build, arrays: Iterable[tuple[str, np.ndarray]], shape: BlockShape) -> DecoderModel:
    config = b.config
    if config.attn_logit_softcapping or config.final_logit_softcapping:
        raise ModelLoadFailed("Gemma logit soft-capping (Gemma 2) is not supported")
    weights = Weights.load(arrays, b)
    ropes = (
        Rope(config.head_dim, config.rope_local_theta or 10000.0, None),  # sliding layers'
        Rope(config.head_dim, config.rope_theta, config.rope_scaling),  # global layers'
    )
    layers = range(config.num_hidden_layers)
    blocks = [_gemma3_block(weights.layer(i), i, ropes) for i in layers]
    # Hugging Face multiplies by √hidden rounded to the model dtype.
    rounded = mx.array(math.sqrt(config.hidden_size), dtype=b.dtype).astype(mx.float32)
    return decoder(weights, blocks, float(np.array(rounded)), norm_offset=1.0)


def _gemma3_block(w: Weights, index: int, ropes: tuple[Rope, Rope]) -> Block:
    """Four `(1 + w)` norms around attention and the MLP, q/k norms, queries scaled by
    `query_pre_attn_scalar`; a sliding layer's own rope."""
    config = w.build.config
    window = config.layer_window(index)
    scale = (config.query_pre_attn_scalar or config.head_dim) ** -0.5
    qk_norms = (w.rms_norm("self_attn.q_norm", 1.0), w.rms_norm("self_attn.k_norm", 1.0))
    projections = w.qkv_and_o(config.attention_bias, config.attention_bias)
    rope = ropes[0] if window is not None else ropes[1]
    how = LayerAttention(scale, window)
    attention = Attention(config, index, projections, rope, how, qk_norms)
    norms = (w.rms_norm("input_layernorm", 1.0), w.rms_norm("pre_feedforward_layernorm", 1.0))
    post_norms = (
        w.rms_norm("post_attention_layernorm", 1.0),
        w.rms_norm("post_feedforward_layernorm", 1.0),
    )
    return Block(attention, w.gated_mlp(config.hidden_act), norms, post_norms)


def _gpt_oss(b: Build, arrays: Iterable[tuple[str, np.ndarray]], shape: BlockShape) -> DecoderModel:
    config = b.config
    weights = Weights.load(arrays, b)
    rope = Rope(config.head_dim, config.rope_theta, config.rope_scaling)
    blocks = []
    for i in range(config.num_hidden_layers):
        w = weights.layer(i)
        sinks = w.take("self_attn.sinks")  # in the dtype: MLX's attention asks for it
        how = LayerAttention(config.head_dim**-0.5, config.layer_window(i), sinks)
        attention = Attention(config, i, w.qkv_and_o(True, True), rope, how)
        norms = (w.rms_norm("input_layernorm"), w.rms_norm("post_attention_layernorm"))
        blocks.append(Block(attention, _experts(w), norms))
    return decoder(weights, blocks)


def _experts(w: Weights) -> Experts:
    prefix = "mlp.experts."
    gate, up = w.take(prefix + "gate_proj.weight"), w.take(prefix + "up_proj.weight")
    gate_b, up_b = w.take(prefix + "gate_proj.bias"), w.take(prefix + "up_proj.bias")
    down, down_b = w.take(prefix + "down_proj.weight"), w.take(prefix + "down_proj.bias")
    config = w.build.config
    experts: list[FeedForward] = [
        ClampedSwiGLU(
            w.linear(mx.concatenate([gate[e], up[e]]), mx.concatenate([gate_b[e], up_b[e]])),
            w.linear(down[e], down_b[e]),
            config.swiglu_limit,
            config.swiglu_alpha,
        )
        for e in range(config.num_local_experts)
    ]
    router = w.linear(w.take("mlp.router.weight"), w.take("mlp.router.bias"))
    return Experts(SoftmaxOfTopK(router, config.num_experts_per_tok), experts)


Builder = Callable[[Build, Iterable[tuple[str, np.ndarray]], BlockShape], DecoderModel]

# A family's `BlockShape.skeleton` → its builder.
_SKELETONS: dict[str, Builder] = {"llama": _llama, "gemma3": _gemma3, "gpt_oss": _gpt_oss}


def build_model(b: Build, arrays: Iterable[tuple[str, np.ndarray]]) -> DecoderModel:
    """The model of `b.config.model_type`'s family, its weights converted as each layer takes
    them."""
    family = family_of(b.config.model_type)
    if family is None:
        raise ModelLoadFailed(
            f"the mlx backend cannot run model_type {b.config.model_type!r} "
            f"(supported: {', '.join(supported_model_types())})"
        )
    builder = _SKELETONS[family.block.skeleton]
    return builder(b, family.weight_names(arrays, b.config), family.block)
