"""A tiny Llama with random weights, named as Hugging Face names them: for tests of the torch
runner that need a real model and no download."""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
from safetensors.numpy import save_file

from semantic.models.config import ModelConfig


def tiny_llama(
    tied: bool, vocab_size: int = 300, seed: int = 0
) -> tuple[ModelConfig, list[tuple[str, np.ndarray]]]:
    """Random weights of a 2-layer Llama with head_dim 64 (the same shape for every seed)."""
    config = ModelConfig(
        model_type="llama",
        vocab_size=vocab_size,
        hidden_size=192,
        intermediate_size=250,  # odd sizes: panels and pairs padded
        num_hidden_layers=2,
        num_attention_heads=3,
        num_key_value_heads=1,
        head_dim=64,
        max_position_embeddings=512,
        tie_word_embeddings=tied,
    )
    g = torch.Generator().manual_seed(seed)

    def rand(*shape: int) -> np.ndarray:
        return (torch.randn(*shape, generator=g) * 0.05).numpy()

    d, f, kv = config.hidden_size, config.intermediate_size, config.head_dim
    weights = [("model.embed_tokens.weight", rand(config.vocab_size, d))]
    for i in range(config.num_hidden_layers):
        p = f"model.layers.{i}."
        weights += [
            (p + "self_attn.q_proj.weight", rand(d, d)),
            (p + "self_attn.k_proj.weight", rand(kv, d)),
            (p + "self_attn.v_proj.weight", rand(kv, d)),
            (p + "self_attn.o_proj.weight", rand(d, d)),
            (p + "mlp.gate_proj.weight", rand(f, d)),
            (p + "mlp.up_proj.weight", rand(f, d)),
            (p + "mlp.down_proj.weight", rand(d, f)),
            (p + "input_layernorm.weight", 1 + rand(d)),
            (p + "post_attention_layernorm.weight", 1 + rand(d)),
        ]
    weights.append(("model.norm.weight", 1 + rand(d)))
    if not tied:
        weights.append(("lm_head.weight", rand(config.vocab_size, d)))
    return config, weights


def write_hf_dir(folder: Path, tokenizer_dir: Path, seed: int = 0) -> Path:
    """A Hugging Face model folder of `tiny_llama` (untied, the tokenizer's vocabulary) with
    the tokenizer of `tokenizer_dir`: what `semantic serve --model` loads."""
    vocab = len(json.loads((tokenizer_dir / "tokenizer.json").read_text())["model"]["vocab"])
    config, weights = tiny_llama(tied=False, vocab_size=vocab, seed=seed)
    folder.mkdir(parents=True)
    hf_config = {k: v for k, v in asdict(config).items() if k != "eos_token_ids"}
    (folder / "config.json").write_text(json.dumps(hf_config | {"eos_token_id": 2}))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tokenizer_dir / name, folder / name)
    save_file(dict(weights), str(folder / "model.safetensors"))
    return folder
