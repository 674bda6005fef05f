"""The Gemma 3 skeleton (the text model; a multimodal checkpoint's language model too): four
RMSNorms per block, each `(1 + w)` and scaled in fp32 (around attention and around the MLP,
the outputs normalised before the residual add); RMSNorms of each head's q and k; queries scaled by
`query_pre_attn_scalar`; a GeGLU MLP (tanh GELU); embeddings times √hidden; tied LM head.
Sliding layers (five in six) read a window and rotate with their own rope base
(`rope_local_theta`, 10,000); global layers read everything, with `rope_theta` and its scaling.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np
import torch

from semantic.backends.torch.attention import LayerAttention
from semantic.backends.torch.models.layers import (
    Attention,
    Block,
    Build,
    DecoderModel,
    RMSNorm,
    activation,
)
from semantic.backends.torch.models.rope import Rope
from semantic.backends.torch.models.weights import Weights, decoder
from semantic.errors import ModelLoadFailed
from semantic.models.families.family import BlockShape
from semantic.models.q6k import Blocks


def gemma_norm(w: Weights, name: str) -> RMSNorm:
    return w.rms_norm(name, offset=1.0, scale_in_fp32=True)


def block(w: Weights, index: int, local_rope: Rope, global_rope: Rope) -> Block:
    config = w.build.config
    window = config.layer_window(index)
    qkv, o = w.qkv_and_o(qkv_bias=config.attention_bias, o_bias=config.attention_bias)
    scalar = config.query_pre_attn_scalar or config.head_dim
    how = LayerAttention(scalar**-0.5, window)
    qk_norms = (gemma_norm(w, "self_attn.q_norm"), gemma_norm(w, "self_attn.k_norm"))
    rope = global_rope if window is None else local_rope
    return Block(
        Attention(config, qkv, o, rope, how, w.build.kernels, qk_norms),
        w.gated_mlp(activation(config.hidden_act)),
        gemma_norm(w, "input_layernorm"),
        gemma_norm(w, "pre_feedforward_layernorm"),
        post_attn_norm=gemma_norm(w, "post_attention_layernorm"),
        post_mlp_norm=gemma_norm(w, "post_feedforward_layernorm"),
    )


def build(
    b: Build, arrays: Iterable[tuple[str, np.ndarray | Blocks]], shape: BlockShape
) -> DecoderModel:
    config = b.config
    if config.attn_logit_softcapping or config.final_logit_softcapping:
        raise ModelLoadFailed("Gemma logit soft-capping (Gemma 2) is not supported")
    weights = Weights.load(arrays, b)
    global_rope = Rope(config.head_dim, config.rope_theta, config.rope_scaling, b.device)
    local_rope = Rope(config.head_dim, config.rope_local_theta or 10000.0, None, b.device)
    blocks = [
        block(weights.layer(i), i, local_rope, global_rope) for i in range(config.num_hidden_layers)
    ]
    # Hugging Face multiplies by √hidden rounded to the model dtype.
    embed_scale = float(torch.tensor(math.sqrt(config.hidden_size), dtype=b.dtype))
    return decoder(weights, blocks, embed_scale=embed_scale, norm_offset=1.0, scale_in_fp32=True)
