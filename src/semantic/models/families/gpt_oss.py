"""GPT-OSS: pre-norm blocks of attention with biases and a sink logit per head (sliding and
global layers alternate, sliding first), YaRN rope, and a mixture of experts: a router picks
the top k experts of each token, whose outputs are summed with the softmax of their router
logits. Each expert is a clamped SwiGLU variant, `(up + 1) · gate · σ(α · gate)`, with biases.

The released checkpoints' MXFP4 experts are dequantized on load (`models/mxfp4.py`, or the
`gguf` package for GGUF files). Our expert names are per projection, `[E, out, in]` (as GGUF
stores them); `experts_split` turns the Hugging Face layout (gate and up interleaved in one
`[E, in, 2I]`) into it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from semantic.models.families.family import (
    FULL_ATTENTION,
    GGUF_EXPERT_TENSORS,
    SLIDING_ATTENTION,
    BlockShape,
    ConfigRules,
    Family,
    GGUFMetadata,
    GGUFRules,
    ModelShape,
    full_every,
    gguf_expert_counts,
)

_EXPERTS = ".mlp.experts."


def experts_split(
    arrays: Iterable[tuple[str, np.ndarray]], config: ModelShape | None = None
) -> Iterator[tuple[str, np.ndarray]]:
    """Hugging Face's fused expert tensors as ours: gate and up apart, each `[E, out, in]`."""
    for name, array in arrays:
        base, _, kind = name.rpartition(_EXPERTS)
        prefix = f"{base}{_EXPERTS}"
        if not base:
            yield name, array
        elif kind == "gate_up_proj":  # [E, in, 2I], gate and up interleaved along the last
            yield prefix + "gate_proj.weight", array[..., 0::2].swapaxes(1, 2)
            yield prefix + "up_proj.weight", array[..., 1::2].swapaxes(1, 2)
        elif kind == "gate_up_proj_bias":  # [E, 2I]
            yield prefix + "gate_proj.bias", array[..., 0::2]
            yield prefix + "up_proj.bias", array[..., 1::2]
        elif kind == "down_proj":  # [E, I, out]
            yield prefix + "down_proj.weight", array.swapaxes(1, 2)
        elif kind == "down_proj_bias":
            yield prefix + "down_proj.bias", array
        else:
            yield name, array


def alternating_sliding_first(config: dict[str, Any], layer: int) -> str:
    return SLIDING_ATTENTION if layer % 2 == 0 else FULL_ATTENTION


def gguf_fields(gguf: GGUFMetadata, fields: dict[str, Any]) -> dict[str, Any]:
    """The experts' counts; their width stands in for the dense MLP's, which GPT-OSS has not;
    YaRN untruncated, as GPT-OSS's own config says."""
    experts = gguf.arch("expert_feed_forward_length", None)
    scaling = fields["rope_scaling"]
    return {
        **gguf_expert_counts(gguf),
        "intermediate_size": int(experts or gguf.arch("feed_forward_length")),
        "rope_scaling": None if scaling is None else {**scaling, "truncate": False},
    }


FAMILY = Family(
    model_types=("gpt_oss",),
    block=BlockShape(skeleton="gpt_oss"),
    config=ConfigRules(layer_type=alternating_sliding_first),
    gguf=GGUFRules(
        architectures=("gpt-oss",),
        tensor_names={
            "post_attention_norm": "post_attention_layernorm",
            "attn_sinks": "self_attn.sinks",
            "ffn_gate_inp": "mlp.router",
            **GGUF_EXPERT_TENSORS,
        },
        layer_types=full_every(2),
        fields=gguf_fields,
    ),
    weight_names=experts_split,
)
