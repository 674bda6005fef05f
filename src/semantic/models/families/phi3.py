"""Phi-3 (Phi-3-mini/medium, Phi-3.5-mini, Phi-4-mini, Phi-4): Llama's blocks, their checkpoint
fusing q/k/v into `qkv_proj` and gate/up into `gate_up_proj` (split at load); no biases;
LongRoPE on the 128K-context models (older configs name it `yarn` or `su`), over the first 3/4
of each head on Phi-4-mini; a sliding window in every layer where the config sets one smaller
than the context. Its GGUF keeps the fused tensors and the LongRoPE factor lists as tensors,
and counts the rotated dims only in `rope.dimension_count`."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np

from semantic.errors import ModelLoadFailed
from semantic.models.families.family import (
    ConfigRules,
    Family,
    GGUFRules,
    ModelShape,
    all_sliding,
)


def fused_split(
    arrays: Iterable[tuple[str, np.ndarray]], config: ModelShape
) -> Iterator[tuple[str, np.ndarray]]:
    """The fused `qkv_proj` (q, k, v stacked on out) and `gate_up_proj` (gate, then up) as
    Llama's projections: views, not copies (the backends fuse them again as they convert)."""
    q_rows = config.num_attention_heads * config.head_dim
    kv_rows = config.num_key_value_heads * config.head_dim
    for name, array in arrays:
        base, _, kind = name.rpartition(".")
        if base.endswith("self_attn.qkv_proj"):
            if array.shape[0] != q_rows + 2 * kv_rows:
                raise ModelLoadFailed(f"{name!r} has shape {array.shape}")
            prefix = base.removesuffix("qkv_proj")
            q, k, v = np.split(array, (q_rows, q_rows + kv_rows))
            yield f"{prefix}q_proj.{kind}", q
            yield f"{prefix}k_proj.{kind}", k
            yield f"{prefix}v_proj.{kind}", v
        elif base.endswith("mlp.gate_up_proj"):
            prefix = base.removesuffix("gate_up_proj")
            gate, up = np.split(array, 2)
            yield f"{prefix}gate_proj.{kind}", gate
            yield f"{prefix}up_proj.{kind}", up
        else:
            yield name, array


FAMILY = Family(
    model_types=("phi3",),
    config=ConfigRules(yarn_is_longrope=True),
    gguf=GGUFRules(
        architectures=("phi3",),
        tensor_names={"attn_qkv": "self_attn.qkv_proj", "ffn_up": "mlp.gate_up_proj"},
        # Its window, where the file has one, in every layer, as transformers applies it.
        layer_types=all_sliding,
        head_dim_from_rope=False,
    ),
    weight_names=fused_split,
)
