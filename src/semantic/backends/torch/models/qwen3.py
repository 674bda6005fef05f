"""Qwen3 (dense): Llama's blocks with an RMSNorm over each head's query and key before rope
(`q_norm`, `k_norm`), no biases unless `attention_bias`, head_dim set apart from hidden_size.
`<think>` blocks are plain text to the model; the APIs pass them on."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from semantic.backends.torch.models import llama
from semantic.backends.torch.models.layers import Build, DecoderModel
from semantic.models.q4k import Q4KBlocks

VARIANT = llama.Variant(qk_norms=True)


def build(b: Build, arrays: Iterable[tuple[str, np.ndarray | Q4KBlocks]]) -> DecoderModel:
    return llama.build(b, arrays, VARIANT)
