"""GPT-OSS: pre-norm blocks of attention with biases and a sink logit per head (sliding and
global layers alternate, sliding first), YaRN rope, and a mixture of experts: a router picks
the top k experts of each token, whose outputs are summed with the softmax of their router
logits. Each expert is a clamped SwiGLU variant, `(up + 1) · gate · σ(α · gate)`, with biases.

Expert weights are kept as one `Linear` per expert and projection, in the model dtype: the
MXFP4 weights of the released checkpoints are dequantized on load (`models/mxfp4.py`, or the
`gguf` package for GGUF files). That costs memory (about 4x the packed size) and keeps every
expert on the same kernels as the rest of the model; a packed MXFP4 kernel is future work.
Our expert names are per projection, `[E, out, in]` (as GGUF stores them);
`models/names.py` turns the Hugging Face layout (gate and up interleaved in one
`[E, in, 2I]`) into it.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import torch

from semantic.backends.torch.attention import LayerAttention
from semantic.backends.torch.linear import Linear
from semantic.backends.torch.models.layers import Attention, Block, Build, DecoderModel
from semantic.backends.torch.models.rope import Rope
from semantic.backends.torch.models.weights import Weights, decoder
from semantic.models.names import gpt_oss_experts_split


class Experts:
    """The MoE layer: router, top-k, and each chosen expert over the tokens that chose it."""

    def __init__(
        self,
        router: Linear,
        gate_up: list[Linear],
        down: list[Linear],
        top_k: int,
        limit: float,
        alpha: float,
    ) -> None:
        self.router = router
        self.gate_up = gate_up
        self.down = down
        self.top_k = top_k
        self.limit = limit
        self.alpha = alpha

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        # x: [T, D] → [T, D]
        logits = self.router(x)  # [T, E]
        top, chosen = torch.topk(logits, self.top_k, dim=-1)  # [T, k]
        weights = torch.softmax(top, dim=-1, dtype=top.dtype)
        out = torch.zeros_like(x)
        for expert in torch.unique(chosen).tolist():
            rows, slot = torch.where(chosen == expert)
            gate, up = self.gate_up[expert](x[rows]).chunk(2, dim=-1)
            gate = gate.clamp(max=self.limit)
            up = up.clamp(min=-self.limit, max=self.limit)
            hidden = (up + 1) * (gate * torch.sigmoid(gate * self.alpha))
            y = self.down[expert](hidden) * weights[rows, slot, None]
            out.index_add_(0, rows, y.to(out.dtype))
        return out


def experts(w: Weights) -> Experts:
    config, linear = w.build.config, w.build.linear
    prefix = "mlp.experts."
    gate, up = w.take(prefix + "gate_proj.weight"), w.take(prefix + "up_proj.weight")
    gate_b, up_b = w.take(prefix + "gate_proj.bias"), w.take(prefix + "up_proj.bias")
    down, down_b = w.take(prefix + "down_proj.weight"), w.take(prefix + "down_proj.bias")
    count = config.num_local_experts
    gate_up = [
        linear(torch.cat([gate[e], up[e]]), torch.cat([gate_b[e], up_b[e]])) for e in range(count)
    ]
    downs = [linear(down[e].contiguous(), down_b[e].contiguous()) for e in range(count)]
    router = linear(w.take("mlp.router.weight"), w.take("mlp.router.bias"))
    return Experts(
        router, gate_up, downs, config.num_experts_per_tok, config.swiglu_limit, config.swiglu_alpha
    )


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


def build(b: Build, arrays: Iterable[tuple[str, np.ndarray]]) -> DecoderModel:
    config = b.config
    weights = Weights.load(gpt_oss_experts_split(arrays), b)
    rope = Rope(config.head_dim, config.rope_theta, config.rope_scaling, b.device)
    blocks = [block(weights.layer(i), i, rope) for i in range(config.num_hidden_layers)]
    return decoder(weights, blocks, scale_in_fp32=True)
