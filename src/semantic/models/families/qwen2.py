"""Qwen2 and Qwen2.5 (their coder variants too): Llama's blocks with biases on the Q, K and V
projections (none on the output), which its config has no flag for; tied or untied
embeddings; where `use_sliding_window` is set, a sliding window in the layers from
`max_window_layers` on."""

from __future__ import annotations

from typing import Any

from semantic.models.families.family import (
    FULL_ATTENTION,
    SLIDING_ATTENTION,
    BlockShape,
    ConfigRules,
    Family,
    GGUFRules,
)


def window_above_max_window_layers(config: dict[str, Any], layer: int) -> str:
    """A window only when asked for, in the layers from `max_window_layers` on (Qwen3's too)."""
    above = layer >= config.get("max_window_layers", 0)
    return SLIDING_ATTENTION if config.get("use_sliding_window") and above else FULL_ATTENTION


FAMILY = Family(
    model_types=("qwen2",),
    block=BlockShape(qkv_bias=True, o_bias=False),
    config=ConfigRules(attention_bias=True, layer_type=window_above_max_window_layers),
    gguf=GGUFRules(architectures=("qwen2",), blocks_kept=True),
)
