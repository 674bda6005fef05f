"""The family registry: each family one record, found by its model types and GGUF
architectures, each named once; every block shape a family names has a builder on both
backends; a model type no family claims is refused by name."""

from __future__ import annotations

import importlib
from typing import Any

import pytest

from semantic.errors import ModelLoadFailed
from semantic.models.config import ModelConfig
from semantic.models.families import (
    FAMILIES,
    family_of,
    family_of_gguf,
    supported_gguf_architectures,
    supported_model_types,
)

CONFIG: dict[str, Any] = {
    "vocab_size": 64,
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
}


def test_every_model_type_and_architecture_finds_the_one_family_that_names_it() -> None:
    model_types = [t for f in FAMILIES for t in (*f.model_types, *f.aliases)]
    architectures = [a for f in FAMILIES if f.gguf for a in f.gguf.architectures]
    assert len(model_types) == len(set(model_types))
    assert len(architectures) == len(set(architectures))
    for family in FAMILIES:
        assert all(family_of(t) is family for t in (*family.model_types, *family.aliases))
        gguf = family.gguf.architectures if family.gguf else ()
        assert all(family_of_gguf(a) is family for a in gguf)
    assert set(supported_model_types()) >= {"llama", "mistral", "qwen3_moe", "gemma3", "phi3"}
    assert "gpt-oss" in supported_gguf_architectures() and family_of("bert") is None


def test_an_alias_reads_as_its_family_and_an_unknown_type_keeps_the_plain_defaults() -> None:
    assert ModelConfig.from_hf({**CONFIG, "model_type": "gemma3_text"}).model_type == "gemma3"
    unknown = ModelConfig.from_hf({**CONFIG, "model_type": "bert", "sliding_window": 8})
    assert unknown.model_type == "bert" and not unknown.tie_word_embeddings
    assert unknown.rope_theta == 10000.0 and unknown.layer_window(1) == 8


def test_every_block_shape_has_a_builder_on_the_torch_backend() -> None:
    for family in FAMILIES:
        module = importlib.import_module(f"semantic.backends.torch.models.{family.block.skeleton}")
        assert callable(module.build)


def test_a_model_type_no_family_claims_is_refused_with_the_supported_ones() -> None:
    from semantic.backends.torch.runner import TorchRunner

    config = ModelConfig.from_hf({**CONFIG, "model_type": "bert"})
    with pytest.raises(ModelLoadFailed, match=r"cannot run model_type 'bert'.*llama"):
        TorchRunner(config, [], block_tokens=8, cache_budget_mb=1, device="cpu")
