"""The Llama family (Llama 3.x, SmolLM2, Mistral): pre-norm blocks of grouped-query attention
and a SwiGLU MLP; rope with Llama 3's, linear or YaRN scaling; tied or untied embeddings; Q/K/V
and output biases where `attention_bias` says; Mistral's sliding window in every layer where
its config sets one. Its block is the skeleton the Qwens, SmolLM3 and Phi-3 vary."""

from __future__ import annotations

from semantic.models.families.family import Family, GGUFRules

FAMILY = Family(
    model_types=("llama", "mistral"),
    # llama.cpp writes Mistral as `llama` too, its Q/K rows permuted (convert_hf_to_gguf).
    gguf=GGUFRules(architectures=("llama",), q_k_permuted=True, blocks_kept=True),
)
