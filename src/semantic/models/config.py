"""The architecture of a checkpoint, in Hugging Face's terms, whatever file it came from."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True, frozen=True)
class ModelConfig:
    """Hyperparameters of a decoder-only transformer, named as in Hugging Face `config.json`.

    Loaders fill this from `config.json` or from GGUF metadata; backends build their model code
    from it. `rope_scaling` is kept as Hugging Face writes it (e.g. Llama 3's `rope_type: llama3`).
    """

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    max_position_embeddings: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = field(default_factory=tuple)

    @classmethod
    def from_hf(cls, config: dict[str, Any]) -> ModelConfig:
        """Read a parsed Hugging Face `config.json`."""
        heads = config["num_attention_heads"]
        # transformers 5 writes RoPE settings as one `rope_parameters` object; older configs
        # have `rope_theta` and `rope_scaling` beside the rest.
        rope = dict(config.get("rope_parameters") or {})
        rope_theta = rope.pop("rope_theta", None) or config.get("rope_theta", 10000.0)
        scaling = config.get("rope_scaling") or (
            rope if rope.get("rope_type", "default") != "default" else None
        )
        eos = config.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,))
        return cls(
            model_type=config.get("model_type", "llama"),
            vocab_size=config["vocab_size"],
            hidden_size=config["hidden_size"],
            intermediate_size=config["intermediate_size"],
            num_hidden_layers=config["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=config.get("num_key_value_heads") or heads,
            head_dim=config.get("head_dim") or config["hidden_size"] // heads,
            max_position_embeddings=config.get("max_position_embeddings", 2048),
            rms_norm_eps=config.get("rms_norm_eps", 1e-6),
            rope_theta=rope_theta,
            rope_scaling=scaling,
            tie_word_embeddings=config.get("tie_word_embeddings", False),
            attention_bias=config.get("attention_bias", False),
            bos_token_id=config.get("bos_token_id"),
            eos_token_ids=eos_ids,
        )
