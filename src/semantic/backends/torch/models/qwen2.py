"""Qwen2 and Qwen2.5 (their coder variants too): Llama's blocks with biases on the Q, K and V
projections (none on the output); tied or untied embeddings; where `use_sliding_window` is set,
a sliding window in the layers from `max_window_layers` on."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from semantic.backends.torch.models import llama
from semantic.backends.torch.models.layers import Build, DecoderModel
from semantic.models.q4k import Q4KBlocks

VARIANT = llama.Variant(qkv_bias=True, o_bias=False)


def build(b: Build, arrays: Iterable[tuple[str, np.ndarray | Q4KBlocks]]) -> DecoderModel:
    return llama.build(b, arrays, VARIANT)
