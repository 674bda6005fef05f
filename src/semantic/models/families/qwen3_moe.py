"""Qwen3 MoE (Qwen3-30B-A3B, Qwen3-Coder-30B-A3B): Qwen3's attention (q/k norms, head_dim apart
from hidden_size) with a mixture of experts in place of the MLP in every sparse layer
(`ModelConfig.layer_has_experts`): the router `gate` takes the softmax over all experts, each
token's top k of it (renormalised where `norm_topk_prob` says) weigh their experts, each a plain
SwiGLU MLP of `moe_intermediate_size`. The other layers keep a dense SwiGLU MLP.

Experts are named per expert, as the released checkpoints store them
(`mlp.experts.<e>.gate_proj.weight`); `experts_split` turns transformers' fused tensors and
GGUF's stacked ones into those names.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from semantic.errors import ModelLoadFailed
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
    gguf_expert_counts,
)

_EXPERTS = ".mlp.experts."
# A layer's experts stacked on their first axis: transformers' fused tensors (its state dict;
# gate then up along `out`) and GGUF's per projection, each `[E, out, in]`.
_STACKED_EXPERTS = {
    "gate_up_proj": ("gate_proj", "up_proj"),
    "down_proj": ("down_proj",),
    "gate_proj.weight": ("gate_proj",),
    "up_proj.weight": ("up_proj",),
    "down_proj.weight": ("down_proj",),
}


def experts_split(
    arrays: Iterable[tuple[str, np.ndarray]], config: ModelShape | None = None
) -> Iterator[tuple[str, np.ndarray]]:
    """Stacked expert tensors as a released Qwen3 MoE checkpoint names them, one `[out, in]`
    per expert and projection (`mlp.experts.<e>.gate_proj.weight`); views, not copies. Per-expert
    tensors pass as they are."""
    for name, array in arrays:
        base, _, kind = name.rpartition(_EXPERTS)
        projections = _STACKED_EXPERTS.get(kind) if base else None
        if projections is None:
            yield name, array
            continue
        if array.ndim != 3 or array.shape[1] % len(projections):
            raise ModelLoadFailed(f"expert tensor {name!r} has shape {array.shape}")
        parts = np.split(array, len(projections), axis=1)
        for projection, stacked in zip(projections, parts, strict=True):
            for expert, weight in enumerate(stacked):
                yield f"{base}{_EXPERTS}{expert}.{projection}.weight", weight


def window_everywhere_if_asked(config: dict[str, Any], layer: int) -> str:
    return SLIDING_ATTENTION if config.get("use_sliding_window") else FULL_ATTENTION


def gguf_fields(gguf: GGUFMetadata, fields: dict[str, Any]) -> dict[str, Any]:
    """llama.cpp always renormalises the chosen weights, as the configs ask; a layer without a
    router keeps its dense MLP. Every layer has tensors: a hostile block_count never makes this
    loop longer than the tensor table."""
    names = gguf.tensor_names
    layers = range(min(gguf.arch("block_count"), len(names)))
    return {
        **gguf_expert_counts(gguf),
        "norm_topk_prob": bool(gguf.arch("expert_weights_norm", True)),
        "mlp_only_layers": tuple(i for i in layers if f"blk.{i}.ffn_gate_inp.weight" not in names),
    }


FAMILY = Family(
    model_types=("qwen3_moe",),
    block=BlockShape(qk_norms=True, experts=True),
    config=ConfigRules(layer_type=window_everywhere_if_asked),
    gguf=GGUFRules(
        architectures=("qwen3moe",),
        tensor_names={"ffn_gate_inp": "mlp.gate", **GGUF_EXPERT_TENSORS},
        fields=gguf_fields,
    ),
    weight_names=experts_split,
)
