"""The layers every family's model is built from on the MLX backend, over the paged KV pool:
linears (dense, or 8-bit with MLX's quantized matmul), RMSNorm, rotary embeddings, attention,
the gated MLP, the decoder block and the decoder (the experts are `experts.py`'s). They compute
what the torch backend's layers compute (`backends/torch/models/layers.py`), in MLX's ops.

Tokens are flattened across the batch (`[T, ...]`, varlen), as on the torch backend. MLX is
lazy: a step builds its graph here and the runner evaluates it once, pool writes included.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from semantic.backends.mlx.attention import LayerAttention, StepInputs, paged_attention
from semantic.backends.mlx.pool import KVPool
from semantic.errors import ModelLoadFailed
from semantic.models.config import ModelConfig
from semantic.models.rope import rope_frequencies

Activation = Callable[[mx.array], mx.array]

_ACTIVATIONS: dict[str, Activation] = {
    "silu": nn.silu,
    "gelu_pytorch_tanh": nn.gelu_approx,
    "gelu": nn.gelu,
}

# How a linear stores its weight: as loaded, in the model dtype; or in MLX's own 8- or 4-bit
# groups (`QuantizedLinear`).
WEIGHT_FORMATS = {"bf16": None, "int8": 8, "int4": 4}


def activation(name: str) -> Activation:
    try:
        return _ACTIVATIONS[name]
    except KeyError:
        raise ModelLoadFailed(f"activation {name!r} is not supported") from None


class Linear:
    """y = x Wᵀ + b over a weight `[out, in]`; its rows are an embedding table's."""

    def __init__(self, weight: mx.array, bias: mx.array | None) -> None:
        self.weight = weight
        self.bias = bias

    def __call__(self, x: mx.array) -> mx.array:
        y = x @ self.weight.T
        return y if self.bias is None else y + self.bias

    def rows(self, ids: mx.array) -> mx.array:
        return self.weight[ids]


class QuantizedLinear(Linear):
    """A weight in 8- or 4-bit groups along its input (`mx.quantize`: a scale and an offset per
    group), multiplied by MLX's quantized matmul without being widened first."""

    def __init__(self, weight: mx.array, bias: mx.array | None, group_size: int, bits: int) -> None:
        self.group_size = group_size
        self.bits = bits
        quantized = mx.quantize(weight, group_size=group_size, bits=bits)
        self.packed, self.scales, self.offsets = quantized
        self.bias = bias

    def __call__(self, x: mx.array) -> mx.array:
        y = mx.quantized_matmul(
            x,
            self.packed,
            self.scales,
            self.offsets,
            transpose=True,
            group_size=self.group_size,
            bits=self.bits,
        )
        return y if self.bias is None else y + self.bias

    def rows(self, ids: mx.array) -> mx.array:
        return mx.dequantize(
            self.packed[ids],
            self.scales[ids],
            self.offsets[ids],
            group_size=self.group_size,
            bits=self.bits,
        )


def linear(weight: mx.array, bias: mx.array | None, weight_format: str) -> Linear:
    """A linear storing its weight as `weight_format` says; "int8" and "int4" where the input
    width divides into MLX's quantization groups, dense otherwise."""
    bits = WEIGHT_FORMATS[weight_format]
    if bits is not None:
        for group_size in (64, 32):
            if weight.shape[-1] % group_size == 0:
                return QuantizedLinear(weight, bias, group_size, bits)
    return Linear(weight, bias)


class RMSNorm:
    """MLX's fused RMSNorm: it normalises and scales in fp32 and rounds once, as Gemma and
    GPT-OSS do (Llama rounds before scaling: the same function to the dtype's precision).
    Gemma's `1 + w` is folded into the weight at load."""

    def __init__(self, weight: mx.array, eps: float) -> None:
        self.weight = weight
        self.eps = eps

    def __call__(self, x: mx.array) -> mx.array:
        return mx.fast.rms_norm(x, self.weight, self.eps)


class Rope:
    """One rotary embedding in Hugging Face's half-split layout: its inverse frequencies and
    the factor on each one's cos and sin (YaRN's, LongRoPE's; partial rotary's pass-through:
    `models/rope.py`)."""

    def __init__(
        self,
        head_dim: int,
        theta: float,
        scaling: dict[str, Any] | None,
        rotary_dim: int | None = None,
    ) -> None:
        self.inv_freq, factors = rope_frequencies(head_dim, theta, scaling, rotary_dim)
        self.factors = factors if (factors != 1.0).any() else None

    def tables(self, positions: np.ndarray, dtype: mx.Dtype) -> tuple[mx.array, mx.array]:
        # positions: [T] → cos, sin_signed ([-sin, sin]): [T, 1, D]
        freqs = positions[:, None].astype(np.float32) * self.inv_freq  # [T, D/2]
        cos, sin = np.cos(freqs), np.sin(freqs)
        if self.factors is not None:
            cos, sin = cos * self.factors, sin * self.factors
        cos = np.concatenate([cos, cos], -1)[:, None]
        sin = np.concatenate([-sin, sin], -1)[:, None]
        return mx.array(cos).astype(dtype), mx.array(sin).astype(dtype)


def apply_rope(x: mx.array, cos: mx.array, sin_signed: mx.array) -> mx.array:
    # x: [T, N, D]; cos, sin_signed: [T, 1, D]
    half = x.shape[-1] // 2
    swapped = mx.concatenate([x[..., half:], x[..., :half]], -1)  # [x2, x1]
    return x * cos + swapped * sin_signed


@dataclass(slots=True, frozen=True)
class Step:
    """What every layer reads in a step: its inputs, the pool, and each rope's tables."""

    inputs: StepInputs
    pool: KVPool
    rope_tables: dict[Rope, tuple[mx.array, mx.array]]


class Attention:
    """Grouped-query attention over the pool: fused QKV projection (with its bias, if any),
    optional RMSNorms of each head's q and k (Qwen3, Gemma 3), rope (none where `rope` is
    None, a NoPE layer of SmolLM3), paged attention as the layer's `LayerAttention` says
    (scale, sliding window, sinks), output projection."""

    def __init__(
        self,
        config: ModelConfig,
        layer: int,
        projections: tuple[Linear, Linear],
        rope: Rope | None,
        how: LayerAttention,
        qk_norms: tuple[RMSNorm, RMSNorm] | None = None,
    ) -> None:
        self.layer = layer
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.qkv, self.o = projections
        self.rope = rope
        self.how = how
        self.qk_norms = qk_norms

    def __call__(self, x: mx.array, step: Step) -> mx.array:
        # x: [T, D_model]
        tokens = x.shape[0]
        heads, kv_heads = self.heads, self.kv_heads
        qkv = self.qkv(x).reshape(tokens, heads + 2 * kv_heads, self.head_dim)
        q, k, v = qkv[:, :heads], qkv[:, heads : heads + kv_heads], qkv[:, heads + kv_heads :]
        if self.qk_norms is not None:
            q, k = self.qk_norms[0](q), self.qk_norms[1](k)
        if self.rope is not None:
            cos, sin_signed = step.rope_tables[self.rope]
            q, k = apply_rope(q, cos, sin_signed), apply_rope(k, cos, sin_signed)
        group, i = step.pool.where[self.layer]
        reads = step.inputs.groups[group]
        out = paged_attention(q, k, v, step.pool, i, reads, self.how)  # [T, H, D]
        return self.o(out.reshape(tokens, heads * self.head_dim))


class GatedMLP:
    """down(act(gate(x)) · up(x)), gate and up in one matmul: SwiGLU (Llama, Qwen), GeGLU
    with tanh-GELU (Gemma)."""

    def __init__(self, gate_up: Linear, down: Linear, act: Activation) -> None:
        self.gate_up = gate_up
        self.down = down
        self.act = act

    def __call__(self, x: mx.array) -> mx.array:
        gate, up = mx.split(self.gate_up(x), 2, axis=-1)  # [T, I] each
        return self.down(self.act(gate) * up)


FeedForward = Callable[[mx.array], mx.array]


class Block:
    """A pre-norm decoder block; Gemma's also normalises each sublayer's output
    (`post_attn_norm`, `post_mlp_norm`) before adding it to the residual stream."""

    def __init__(
        self,
        attn: Attention,
        mlp: FeedForward,
        norms: tuple[RMSNorm, RMSNorm],
        post_norms: tuple[RMSNorm, RMSNorm] | None = None,
    ) -> None:
        self.attn = attn
        self.mlp = mlp
        self.attn_norm, self.mlp_norm = norms
        self.post_norms = post_norms

    def __call__(self, x: mx.array, step: Step) -> mx.array:
        h = self.attn(self.attn_norm(x), step)
        if self.post_norms is not None:
            h = self.post_norms[0](h)
        x = x + h
        h = self.mlp(self.mlp_norm(x))
        if self.post_norms is not None:
            h = self.post_norms[1](h)
        return x + h


class DecoderModel:
    """Embeddings, blocks and the LM head, bound to no KV storage: the step names the pool.
    `embed_scale` multiplies the embeddings (Gemma: √hidden, rounded to the model dtype)."""

    def __init__(
        self,
        embed: Linear,
        blocks: list[Block],
        norm: RMSNorm,
        lm_head: Linear,
        embed_scale: float | None = None,
    ) -> None:
        self.embed = embed
        self.blocks = blocks
        self.norm = norm
        self.lm_head = lm_head
        self.embed_scale = embed_scale
        ropes = (block.attn.rope for block in blocks)
        self.ropes = list(dict.fromkeys(rope for rope in ropes if rope is not None))

    @property
    def layer_windows(self) -> tuple[int | None, ...]:
        return tuple(block.attn.how.window for block in self.blocks)

    def forward(self, inputs: StepInputs, pool: KVPool) -> mx.array:
        # → hidden: [T, D_model]
        x = self.embed.rows(inputs.input_ids)
        if self.embed_scale is not None:
            x = x * self.embed_scale
        tables = {rope: rope.tables(inputs.positions, x.dtype) for rope in self.ropes}
        step = Step(inputs, pool, tables)
        for block in self.blocks:
            x = block(x, step)
        return x

    def logits(self, hidden: mx.array) -> mx.array:
        # hidden: [N, D_model] → [N, V] fp32
        return self.lm_head(self.norm(hidden)).astype(mx.float32)
