"""A checkpoint's tensors by Hugging Face name, and the shared layers built from them.

Every family reads its weights through `Weights`: each tensor is converted to the model's dtype
and device as it arrives, taken once by the layer that owns it, and any left over at the end is
an error (a checkpoint of another architecture must not load half-used).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np
import torch

from semantic.backends.torch.linear import DenseLinear, Linear
from semantic.backends.torch.models.layers import (
    Activation,
    Block,
    Build,
    DecoderModel,
    GatedMLP,
    RMSNorm,
)
from semantic.errors import ModelLoadFailed

Rename = Callable[[str], str | None]  # a checkpoint name → ours, or None to skip the tensor


class Weights:
    """The checkpoint's tensors, converted on arrival; `take` hands each out once. `layer(i)`
    is the same store seen from `model.layers.<i>.`, so a block names its weights relatively."""

    def __init__(self, tensors: dict[str, torch.Tensor], build: Build, prefix: str = "") -> None:
        self._tensors = tensors
        self.build = build
        self.prefix = prefix

    @classmethod
    def load(
        cls,
        arrays: Iterable[tuple[str, np.ndarray | torch.Tensor]],
        build: Build,
        rename: Rename | None = None,
    ) -> Weights:
        tensors = {}
        for name, array in arrays:
            renamed = rename(name) if rename is not None else name
            if renamed is None or renamed.endswith("rotary_emb.inv_freq"):
                continue
            tensors[renamed] = build.tensor(_as_tensor(array))
        return cls(tensors, build)

    def take(self, name: str) -> torch.Tensor:
        try:
            return self._tensors.pop(self.prefix + name)
        except KeyError:
            raise ModelLoadFailed(f"checkpoint lacks weight {self.prefix}{name}") from None

    def take_optional(self, name: str) -> torch.Tensor | None:
        return self._tensors.pop(self.prefix + name, None)

    def layer(self, index: int) -> Weights:
        return Weights(self._tensors, self.build, f"{self.prefix}model.layers.{index}.")

    def check_all_taken(self) -> None:
        if self._tensors:
            raise ModelLoadFailed(f"unexpected weights: {sorted(self._tensors)[:20]}")

    def rms_norm(self, name: str, *, offset: float = 0.0, scale_in_fp32: bool = False) -> RMSNorm:
        return norm_from(self.build, self.take(f"{name}.weight"), offset, scale_in_fp32)

    def qkv_and_o(
        self, *, qkv_bias: bool, o_bias: bool, prefix: str = "self_attn."
    ) -> tuple[Linear, Linear]:
        """The Q, K and V projections fused into one linear, and the output projection; each
        with a bias where the family says so (Qwen2: Q/K/V; GPT-OSS: all four)."""
        weight = torch.cat([self.take(f"{prefix}{p}_proj.weight") for p in "qkv"])
        bias = torch.cat([self.take(f"{prefix}{p}_proj.bias") for p in "qkv"]) if qkv_bias else None
        o_b = self.take(f"{prefix}o_proj.bias") if o_bias else None
        linear = self.build.linear
        return linear(weight, bias), linear(self.take(f"{prefix}o_proj.weight"), o_b)

    def gated_mlp(self, act: Activation, prefix: str = "mlp.") -> GatedMLP:
        gate, up = self.take(f"{prefix}gate_proj.weight"), self.take(f"{prefix}up_proj.weight")
        down = self.take(f"{prefix}down_proj.weight")
        linear = self.build.linear
        gate_up = linear(torch.cat([gate, up]), None)
        return GatedMLP(gate_up, linear(down, None), act, self.build.kernels)


def _as_tensor(array: np.ndarray | torch.Tensor) -> torch.Tensor:
    """A checkpoint's array as a tensor (a prepared load's skeleton passes shape-only tensors)."""
    if isinstance(array, torch.Tensor):
        return array
    return torch.from_numpy(np.ascontiguousarray(array))


def norm_from(build: Build, weight: torch.Tensor, offset: float, scale_in_fp32: bool) -> RMSNorm:
    """An RMSNorm over a loaded weight; `offset` 1.0 turns Gemma's `(1 + w)` into a plain
    weight (computed in fp32 before rounding to the model dtype)."""
    if offset:
        weight = (weight.float() + offset).to(build.dtype)
    return RMSNorm(weight, build.config.rms_norm_eps, build.kernels, scale_in_fp32=scale_in_fp32)


def embedding_and_head(weights: Weights) -> tuple[Linear, Linear]:
    """The embedding table and the LM head: one tensor, read both ways, when tied."""
    build = weights.build
    table = weights.take("model.embed_tokens.weight")
    untied = weights.take_optional("lm_head.weight")
    if build.config.tie_word_embeddings:  # a tied checkpoint may list the shared tensor twice
        head = build.linear(table, None)
        return head, head
    if untied is None:
        raise ModelLoadFailed("checkpoint lacks weight lm_head.weight")
    return DenseLinear(table, None), build.linear(untied, None)


def decoder(
    weights: Weights,
    blocks: list[Block],
    *,
    embed_scale: float | None = None,
    norm_offset: float = 0.0,
    scale_in_fp32: bool = False,
) -> DecoderModel:
    """The model around its blocks: embeddings, final norm and LM head, every weight used."""
    embed, head = embedding_and_head(weights)
    norm = weights.rms_norm("model.norm", offset=norm_offset, scale_in_fp32=scale_in_fp32)
    weights.check_all_taken()
    return DecoderModel(weights.build.config, embed, blocks, norm, head, embed_scale)
