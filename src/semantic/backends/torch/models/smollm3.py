"""SmolLM3: Llama's blocks (grouped-query attention, SwiGLU, tied embeddings by default, biases
where `attention_bias` says) in which some layers apply no rotary embedding at all ("NoPE"):
`no_rope_layers[i] == 0`, by default every fourth layer. Where `use_sliding_window` is set,
the rope-less layers slide. Both are per-layer options of the config (`models/config.py`),
which every path (our CPU kernels, stock torch, the CUDA kernels) honours through `llama.py`;
this file names the family. `<think>` blocks are plain text to the model."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from semantic.backends.torch.models import llama
from semantic.backends.torch.models.layers import Build, DecoderModel
from semantic.models.q4k import Q4KBlocks

VARIANT = llama.Variant()


def build(b: Build, arrays: Iterable[tuple[str, np.ndarray | Q4KBlocks]]) -> DecoderModel:
    return llama.build(b, arrays, VARIANT)
