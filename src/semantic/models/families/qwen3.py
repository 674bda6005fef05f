"""Qwen3 (dense): Llama's blocks with an RMSNorm over each head's query and key before rope
(`q_norm`, `k_norm`), no biases unless `attention_bias`, head_dim set apart from hidden_size;
Qwen2's sliding rule. `<think>` blocks are plain text to the model; the APIs pass them on."""

from __future__ import annotations

from semantic.models.families.family import BlockShape, ConfigRules, Family, GGUFRules
from semantic.models.families.qwen2 import window_above_max_window_layers

FAMILY = Family(
    model_types=("qwen3",),
    block=BlockShape(qk_norms=True),
    config=ConfigRules(layer_type=window_above_max_window_layers),
    gguf=GGUFRules(architectures=("qwen3",), blocks_kept=True),
)
