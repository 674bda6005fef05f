"""Phi-3 (Phi-3-mini/medium, Phi-3.5-mini, Phi-4-mini, Phi-4): Llama's blocks, their checkpoint
fusing q/k/v into `qkv_proj` and gate/up into `gate_up_proj` (split at load, `models/names.py`);
no biases; LongRoPE on the 128K-context models, over the first 3/4 of each head on Phi-4-mini;
a sliding window in every layer where the config sets one smaller than the context."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from semantic.backends.torch.models import llama
from semantic.backends.torch.models.layers import Build, DecoderModel
from semantic.models.names import phi3_split


def build(b: Build, arrays: Iterable[tuple[str, np.ndarray]]) -> DecoderModel:
    return llama.build(b, phi3_split(arrays, b.config))
