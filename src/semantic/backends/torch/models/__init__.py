"""The model families of the torch backend, found by the checkpoint's `model_type`.

One file per family, each with the same skeleton (mlx-lm's): how its checkpoint names map to
ours, how one decoder block is built, and `build`, which assembles the model from the shared
layers in `layers.py`; families that are Llama's blocks with other options (Qwen2, Qwen3, Qwen3
MoE, SmolLM3) name their `llama.Variant`; Phi-3 is Llama's blocks under other weight names.
Families are imported only when a model of theirs loads.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable

import numpy as np

from semantic.backends.torch.models.layers import Build, DecoderModel
from semantic.errors import ModelLoadFailed
from semantic.models.q4k import Q4KBlocks

Builder = Callable[[Build, Iterable[tuple[str, np.ndarray | Q4KBlocks]]], DecoderModel]

# model_type → the family's module. Mistral is Llama's code: its sliding window (when its
# config sets one) is a per-layer option every family has.
_FAMILIES = {
    "llama": "llama",
    "mistral": "llama",
    "smollm3": "smollm3",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "qwen3_moe": "qwen3_moe",
    "gemma3": "gemma3",
    "gpt_oss": "gpt_oss",
    "phi3": "phi3",
}


def supported_model_types() -> list[str]:
    return sorted(_FAMILIES)


def build_model(
    build: Build, weights: Iterable[tuple[str, np.ndarray | Q4KBlocks]]
) -> DecoderModel:
    """The model of `build.config.model_type`, its weights converted one tensor at a time."""
    model_type = build.config.model_type
    if model_type not in _FAMILIES:
        raise ModelLoadFailed(
            f"the torch backend cannot run model_type {model_type!r} "
            f"(supported: {', '.join(supported_model_types())})"
        )
    module = importlib.import_module(f"{__name__}.{_FAMILIES[model_type]}")
    builder: Builder = module.build
    return builder(build, weights)
