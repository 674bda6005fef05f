"""The Llama family (Llama 3.x, SmolLM2, Mistral) on the torch backend, over the paged KV pool.

One file, mlx-lm's skeleton: norm → rope → attention → MLP → block → model, plus `load_weights`
for Hugging Face names; linears come from `linear.py`. Tokens are flattened across the batch
(`[T, ...]`, varlen).
Modules are plain classes, not `nn.Module`: a decode step makes ~30 calls per layer and the
module call machinery would add measurable CPU time to each.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from semantic.backends.torch.attention import AttentionMetadata, LayerKV, paged_attention
from semantic.backends.torch.kernels import CpuKernels
from semantic.backends.torch.linear import DenseLinear, Linear, LinearFactory
from semantic.errors import ModelLoadFailed
from semantic.models.config import ModelConfig


class RMSNorm:
    """Like Hugging Face: normalise in fp32, round to the model dtype, then scale. Our CPU
    kernel does it in one call (~2 µs at decode sizes; stock torch takes ~8 ops, ~30 µs)."""

    __slots__ = ("eps", "kernels", "weight")

    def __init__(self, weight: torch.Tensor, eps: float, kernels: CpuKernels | None) -> None:
        self.weight = weight
        self.eps = eps
        self.kernels = kernels

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        # x: [T, D]
        if self.kernels is not None:
            return self.kernels.rms_norm(x, self.weight, self.eps)
        normed = F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps)
        return self.weight * normed.to(x.dtype)


class Rope:
    """Rotary embeddings in Hugging Face's half-split layout; scaling types default, linear, llama3.

    `tables` gives this step's cos and a signed sin (`[-sin, sin]`), so that rotating is
    x·cos + swap_halves(x)·sin_signed: one flip instead of rotate_half's slice-negate-cat.
    """

    def __init__(self, config: ModelConfig, device: torch.device) -> None:
        self.inv_freq = rope_inv_freq(config).to(device)  # [D/2] fp32

    def tables(
        self, positions: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # positions: [T] → cos, sin_signed: [T, 1, D]
        freqs = positions[:, None].float() * self.inv_freq  # [T, D/2]
        cos, sin = freqs.cos(), freqs.sin()
        cos = torch.cat([cos, cos], -1).to(dtype)
        sin = torch.cat([-sin, sin], -1).to(dtype)
        return cos[:, None], sin[:, None]


def rope_inv_freq(config: ModelConfig) -> torch.Tensor:
    """Inverse frequencies as `transformers` computes them for the config's rope type."""
    dim = config.head_dim
    exponents = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim
    inv_freq = 1.0 / (config.rope_theta**exponents)
    scaling = config.rope_scaling or {}
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    if rope_type == "default":
        return inv_freq
    if rope_type == "linear":
        return inv_freq / scaling["factor"]
    if rope_type == "llama3":
        return _llama3_inv_freq(inv_freq, scaling)
    raise ModelLoadFailed(f"rope scaling type {rope_type!r} is not supported for Llama models")


def _llama3_inv_freq(inv_freq: torch.Tensor, scaling: dict[str, Any]) -> torch.Tensor:
    # Llama 3.1: long wavelengths slowed by `factor`, short kept, the band between blended.
    factor = scaling["factor"]
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    old_len = scaling["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < old_len / high) * ~(wavelen > old_len / low)
    return torch.where(medium, blended, scaled)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor) -> torch.Tensor:
    # x: [T, N, D]; cos, sin_signed: [T, 1, D]
    swapped = x.unflatten(-1, (2, -1)).flip(-2).flatten(-2)  # [x2, x1]
    return torch.addcmul(x * cos, swapped, sin_signed)


class Attention:
    """Fused QKV projection, rope on Q and K together, paged attention, output projection."""

    def __init__(self, config: ModelConfig, qkv: Linear, o: Linear) -> None:
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.scale = config.head_dim**-0.5
        self.qkv = qkv
        self.o = o

    def __call__(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        kv: LayerKV,
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        # x: [T, D_model]
        tokens = x.shape[0]
        heads, kv_heads, dim = self.heads, self.kv_heads, self.head_dim
        qkv = self.qkv(x).view(tokens, heads + 2 * kv_heads, dim)  # [T, H + 2·KVH, D]
        qk = apply_rope(qkv[:, : heads + kv_heads], *rope)  # [T, H + KVH, D]
        q, k, v = qk[:, :heads], qk[:, heads:], qkv[:, heads + kv_heads :]
        out = paged_attention(q, k, v, kv, meta, self.scale)  # [T, H, D]
        return self.o(out.reshape(tokens, heads * dim))


class MLP:
    """SwiGLU with the gate and up projections fused into one matmul."""

    def __init__(self, gate_up: Linear, down: Linear) -> None:
        self.gate_up = gate_up
        self.down = down

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        # x: [T, D_model]
        gate, up = self.gate_up(x).chunk(2, dim=-1)  # [T, I] each
        return self.down(F.silu(gate) * up)


class Block:
    def __init__(self, attn: Attention, mlp: MLP, attn_norm: RMSNorm, mlp_norm: RMSNorm) -> None:
        self.attn = attn
        self.mlp = mlp
        self.attn_norm = attn_norm
        self.mlp_norm = mlp_norm

    def __call__(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        kv: LayerKV,
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        # x: [T, D_model], updated in place: the residual stream is this step's own tensor
        x += self.attn(self.attn_norm(x), rope, kv, meta)
        x += self.mlp(self.mlp_norm(x))
        return x


class LlamaModel:
    """Embeddings, blocks and the LM head, bound to no KV storage: the caller passes each
    layer's `LayerKV` and the step's metadata."""

    def __init__(
        self,
        config: ModelConfig,
        embed: Linear,
        blocks: list[Block],
        norm: RMSNorm,
        lm_head: Linear,
        rope: Rope,
    ) -> None:
        self.config = config
        self.embed = embed  # its rows [V, D_model] are the embeddings
        self.blocks = blocks
        self.norm = norm
        self.lm_head = lm_head
        self.rope = rope

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_layers: list[LayerKV],
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        # input_ids, positions: [T] → hidden: [T, D_model]
        x = self.embed.rows(input_ids)
        rope = self.rope.tables(positions, x.dtype)
        for block, kv in zip(self.blocks, kv_layers, strict=True):
            x = block(x, rope, kv, meta)
        return x

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        # hidden: [N, D_model] → [N, V] fp32
        return self.lm_head(self.norm(hidden)).float()


_LAYER_NAME = re.compile(r"model\.layers\.(\d+)\.(.+)")


def load_weights(
    config: ModelConfig,
    weights: Iterable[tuple[str, np.ndarray]],
    *,
    dtype: torch.dtype,
    device: torch.device,
    linear: LinearFactory = DenseLinear,
    kernels: CpuKernels | None = None,
) -> LlamaModel:
    """Build the model from Hugging Face-named arrays, converting one tensor at a time;
    `linear` stores each projection weight (see `linear.py`), `kernels` (CPU, bf16 or fp32)
    computes the norms."""
    layers: list[dict[str, torch.Tensor]] = [{} for _ in range(config.num_hidden_layers)]
    top: dict[str, torch.Tensor] = {}
    for name, array in weights:
        match = _LAYER_NAME.fullmatch(name)
        if match:
            layer, key = int(match.group(1)), match.group(2)
            if layer >= config.num_hidden_layers:
                raise ModelLoadFailed(f"weight {name} is beyond the config's layer count")
            layers[layer][key] = _to_tensor(array, dtype, device)
        elif not name.endswith("rotary_emb.inv_freq"):
            top[name] = _to_tensor(array, dtype, device)
    blocks = [_build_block(config, i, w, linear, kernels) for i, w in enumerate(layers)]
    embed_table = _take(top, "model.embed_tokens.weight")
    if config.tie_word_embeddings:  # one tensor, read as the head's weight and its rows
        head = linear(embed_table, None)
        embed: Linear = head
    else:
        head, embed = linear(_take(top, "lm_head.weight"), None), DenseLinear(embed_table, None)
    norm = RMSNorm(_take(top, "model.norm.weight"), config.rms_norm_eps, kernels)
    top.pop("lm_head.weight", None)  # a tied checkpoint may list the shared tensor twice
    if top:
        raise ModelLoadFailed(f"unexpected weights: {sorted(top)}")
    return LlamaModel(config, embed, blocks, norm, head, Rope(config, device))


def _to_tensor(array: np.ndarray, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A loader's fp32 array → a torch tensor in the model dtype on the device."""
    tensor = torch.from_numpy(np.ascontiguousarray(array))
    return tensor.to(device=device, dtype=dtype).contiguous()


def _build_block(
    config: ModelConfig,
    index: int,
    w: dict[str, torch.Tensor],
    linear: LinearFactory,
    kernels: CpuKernels | None,
) -> Block:
    def take(key: str) -> torch.Tensor:
        return _take(w, key, f"model.layers.{index}.")

    qkv_w = torch.cat([take(f"self_attn.{p}_proj.weight") for p in "qkv"])
    qkv_b = None
    if config.attention_bias:
        qkv_b = torch.cat([take(f"self_attn.{p}_proj.bias") for p in "qkv"])
    o_b = w.pop("self_attn.o_proj.bias", None)
    attn = Attention(config, linear(qkv_w, qkv_b), linear(take("self_attn.o_proj.weight"), o_b))
    gate_up = torch.cat([take("mlp.gate_proj.weight"), take("mlp.up_proj.weight")])
    mlp = MLP(linear(gate_up, None), linear(take("mlp.down_proj.weight"), None))
    eps = config.rms_norm_eps
    block = Block(
        attn,
        mlp,
        RMSNorm(take("input_layernorm.weight"), eps, kernels),
        RMSNorm(take("post_attention_layernorm.weight"), eps, kernels),
    )
    if w:
        raise ModelLoadFailed(f"unexpected weights in layer {index}: {sorted(w)}")
    return block


def _take(weights: dict[str, torch.Tensor], key: str, prefix: str = "") -> torch.Tensor:
    try:
        return weights.pop(key)
    except KeyError:
        raise ModelLoadFailed(f"checkpoint lacks weight {prefix}{key}") from None
