"""Checkpoint tensor names as the families' code reads them, for every backend: a multimodal
Gemma 3 checkpoint's language model under the text model's names, and GPT-OSS's fused expert
tensors split per projection."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np

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
