"""Checkpoint tensor names as the families' code reads them, for every backend: a multimodal
Gemma 3 checkpoint's language model under the text model's names, GPT-OSS's fused expert
tensors split per projection, Qwen3 MoE's stacked expert tensors split per expert, and Phi-3's
fused projections split (its q and k rows in partial rotary's order)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TypeVar

import numpy as np

from semantic.errors import ModelLoadFailed
from semantic.models.config import ModelConfig
from semantic.models.q4k import Q4KBlocks
from semantic.models.rope import rotary_order

_TEXT_PREFIXES = ("model.language_model.", "language_model.model.")  # multimodal checkpoints
_VISION_PREFIXES = (
    "vision_tower.",
    "multi_modal_projector.",
    "model.vision_tower.",
    "model.multi_modal_projector.",
)


def gemma3_text_name(name: str) -> str | None:
    """A multimodal checkpoint's language-model names as the text model's; its vision tower
    and projector skipped."""
    for prefix in _TEXT_PREFIXES:
        if name.startswith(prefix):
            return "model." + name.removeprefix(prefix)
    if name.startswith(_VISION_PREFIXES):
        return None
    return name.removeprefix("language_model.")  # language_model.lm_head.weight


_EXPERTS = ".mlp.experts."


def gpt_oss_experts_split(
    arrays: Iterable[tuple[str, np.ndarray]],
) -> Iterator[tuple[str, np.ndarray]]:
    """Hugging Face's fused expert tensors as ours: gate and up apart, each `[E, out, in]`."""
    for name, array in arrays:
        base, _, kind = name.rpartition(_EXPERTS)
        prefix = f"{base}{_EXPERTS}"
        if not base:
            yield name, array
        elif kind == "gate_up_proj":  # [E, in, 2I], gate and up interleaved along the last
            yield prefix + "gate_proj.weight", array[..., 0::2].swapaxes(1, 2)
            yield prefix + "up_proj.weight", array[..., 1::2].swapaxes(1, 2)
        elif kind == "gate_up_proj_bias":  # [E, 2I]
            yield prefix + "gate_proj.bias", array[..., 0::2]
            yield prefix + "up_proj.bias", array[..., 1::2]
        elif kind == "down_proj":  # [E, I, out]
            yield prefix + "down_proj.weight", array.swapaxes(1, 2)
        elif kind == "down_proj_bias":
            yield prefix + "down_proj.bias", array
        else:
            yield name, array


# A Qwen3 MoE layer's experts stacked on their first axis: transformers' fused tensors (its
# state dict; gate then up along `out`) and GGUF's per projection (as `models/gguf.py` names
# them), each `[E, out, in]`.
_STACKED_EXPERTS = {
    "gate_up_proj": ("gate_proj", "up_proj"),
    "down_proj": ("down_proj",),
    "gate_proj.weight": ("gate_proj",),
    "up_proj.weight": ("up_proj",),
    "down_proj.weight": ("down_proj",),
}


def qwen3_moe_experts_split(
    arrays: Iterable[tuple[str, np.ndarray]],
) -> Iterator[tuple[str, np.ndarray]]:
    """Stacked expert tensors as a released Qwen3 MoE checkpoint names them, one `[out, in]`
    per expert and projection (`mlp.experts.<e>.gate_proj.weight`); views, not copies. Per-expert
    tensors pass as they are."""
    for name, array in arrays:
        base, _, kind = name.rpartition(_EXPERTS)
        projections = _STACKED_EXPERTS.get(kind) if base else None
        if projections is None:
            yield name, array
            continue
        if array.ndim != 3 or array.shape[1] % len(projections):
            raise ModelLoadFailed(f"expert tensor {name!r} has shape {array.shape}")
        parts = np.split(array, len(projections), axis=1)
        for projection, stacked in zip(projections, parts, strict=True):
            for expert, weight in enumerate(stacked):
                yield f"{base}{_EXPERTS}{expert}.{projection}.weight", weight


def phi3_split(
    arrays: Iterable[tuple[str, np.ndarray]], config: ModelConfig
) -> Iterator[tuple[str, np.ndarray]]:
    """Phi-3's fused `qkv_proj` (q, k, v stacked on out) and `gate_up_proj` (gate, then up) as
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


# A loaded tensor: floats, or (the torch backend's GGUF loads) Q4_K matrices' blocks.
Loaded = TypeVar("Loaded", np.ndarray, np.ndarray | Q4KBlocks)

# The tensors whose rows are q's or k's head dims: projections, their biases, q/k norms.
_ROTATED = tuple(
    f"{p}_{kind}" for p in "qk" for kind in ("proj.weight", "proj.bias", "norm.weight")
)


def rotary_rows(
    arrays: Iterable[tuple[str, Loaded]], config: ModelConfig
) -> Iterator[tuple[str, Loaded]]:
    """Each head's dims of the q and k projections (weights, biases, per-head norms) in
    `rotary_order`, where rope rotates only part of a head (Phi-4-mini): the backends'
    full-head rope then rotates exactly the dims partial rotary does. A copy of q and k only
    where it reorders; every other tensor passes as it is."""
    order = rotary_order(config.head_dim, config.rotary_dim)
    for name, array in arrays:
        if order is None or not name.endswith(_ROTATED):
            yield name, array
            continue
        if isinstance(array, Q4KBlocks):  # the loader keeps blocks of whole-head rope only
            raise ModelLoadFailed(f"{name}: Q4_K blocks cannot reorder a head's dims")
        heads = array.shape[0] // config.head_dim
        per_head = array.reshape(heads, config.head_dim, *array.shape[1:])
        yield name, per_head[:, order].reshape(array.shape)
