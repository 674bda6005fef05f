"""A checkpoint's tensors by Hugging Face name, and the shared layers built from them.

Every family reads its weights through `Weights`: each tensor is converted to the model's dtype
and device as it arrives, taken once by the layer that owns it, and any left over at the end is
an error (a checkpoint of another architecture must not load half-used).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np
import torch

from semantic.backends.torch.int4 import Int4Linear, runs_int4
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
from semantic.models.q4k import Q4KBlocks
from semantic.models.q6k import Blocks, Q6KBlocks
from semantic.models.q32 import Q32Blocks

Matrix = torch.Tensor | Blocks  # a linear's weight as loaded: converted, or a GGUF's blocks
Rename = Callable[[str], str | None]  # a checkpoint name → ours, or None to skip the tensor


class Weights:
    """The checkpoint's tensors, converted on arrival; `take` hands each out once. `layer(i)`
    is the same store seen from `model.layers.<i>.`, so a block names its weights relatively."""

    def __init__(self, tensors: dict[str, Matrix], build: Build, prefix: str = "") -> None:
        self._tensors = tensors
        self.build = build
        self.prefix = prefix

    @classmethod
    def load(
        cls,
        arrays: Iterable[tuple[str, np.ndarray | torch.Tensor | Blocks]],
        build: Build,
        rename: Rename | None = None,
    ) -> Weights:
        tensors: dict[str, Matrix] = {}
        for name, array in arrays:
            renamed = rename(name) if rename is not None else name
            if renamed is None or renamed.endswith("rotary_emb.inv_freq"):
                continue
            if isinstance(array, Q4KBlocks | Q6KBlocks | Q32Blocks):
                tensors[renamed] = array
            else:
                tensors[renamed] = build.tensor(_as_tensor(array))
        return cls(tensors, build)

    def take(self, name: str) -> torch.Tensor:
        """A tensor in the model's dtype (a matrix's blocks dequantized: a layer that does not
        compute on blocks reads the values they hold)."""
        return self._dense(self.take_matrix(name))

    def take_optional(self, name: str) -> torch.Tensor | None:
        matrix = self.take_optional_matrix(name)
        return None if matrix is None else self._dense(matrix)

    def take_matrix(self, name: str) -> Matrix:
        """A linear's weight as it arrived: a tensor, or a matrix's blocks."""
        matrix = self.take_optional_matrix(name)
        if matrix is None:
            raise ModelLoadFailed(f"checkpoint lacks weight {self.prefix}{name}")
        return matrix

    def take_optional_matrix(self, name: str) -> Matrix | None:
        return self._tensors.pop(self.prefix + name, None)

    def linear(self, weight: Matrix, bias: torch.Tensor | None) -> Linear:
        """y = x Wᵀ + b as the build stores it; a matrix's blocks on our group kernel (every
        block type) or torch's int4 kernel (Q4_K only) where either runs (`blocks.py`, `int4.py`),
        else their values dequantized."""
        if isinstance(weight, Q4KBlocks | Q6KBlocks | Q32Blocks):
            if self.build.blocks is not None:  # a file's blocks: K in whole ones
                return self.build.blocks(weight, bias)
            if isinstance(weight, Q4KBlocks) and runs_int4(weight, self.build.device):
                return Int4Linear(weight, bias, self.build.dtype)
        return self.build.linear(self._dense(weight), bias)

    def fused(self, names: list[str]) -> Matrix:
        """Weights of one input width stacked by rows into one linear's: Q4_K (or Q5_K) blocks
        stay blocks where every part is one of the same, per-32 blocks where `Q32Blocks.concat`
        keeps them (the symmetric types widened to 8 bits), else all are dequantized."""
        parts = [self.take_matrix(name) for name in names]
        q4k = [p for p in parts if isinstance(p, Q4KBlocks)]
        q32 = [p for p in parts if isinstance(p, Q32Blocks)]
        kept: Matrix | None = None
        if len(q4k) == len(parts):
            kept = Q4KBlocks.concat(q4k)
        elif len(q32) == len(parts):
            kept = Q32Blocks.concat(q32)
        return kept if kept is not None else torch.cat([self._dense(p) for p in parts])

    def _dense(self, matrix: Matrix) -> torch.Tensor:
        if isinstance(matrix, Q4KBlocks | Q6KBlocks | Q32Blocks):
            return self.build.tensor(torch.from_numpy(matrix.dequantize()))
        return matrix

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
        weight = self.fused([f"{prefix}{p}_proj.weight" for p in "qkv"])
        bias = torch.cat([self.take(f"{prefix}{p}_proj.bias") for p in "qkv"]) if qkv_bias else None
        o_b = self.take(f"{prefix}o_proj.bias") if o_bias else None
        return self.linear(weight, bias), self.linear(
            self.take_matrix(f"{prefix}o_proj.weight"), o_b
        )

    def gated_mlp(self, act: Activation, prefix: str = "mlp.") -> GatedMLP:
        gate_up = self.fused([f"{prefix}gate_proj.weight", f"{prefix}up_proj.weight"])
        down = self.take_matrix(f"{prefix}down_proj.weight")
        return GatedMLP(
            self.linear(gate_up, None), self.linear(down, None), act, self.build.kernels
        )


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
    table = weights.take_matrix("model.embed_tokens.weight")
    untied = weights.take_optional_matrix("lm_head.weight")
    if build.config.tie_word_embeddings:  # a tied checkpoint may list the shared tensor twice
        head = weights.linear(table, None)
        return head, head
    if untied is None:
        raise ModelLoadFailed("checkpoint lacks weight lm_head.weight")
    return _table(table, build), weights.linear(untied, None)


def _table(table: Matrix, build: Build) -> Linear:
    """An untied embedding table, only its rows read: a Q4_K table stays 4-bit (no copy for
    the kernel), a Q5_K or per-32 one on its own blocks where our group kernel runs, any other
    of a GGUF computed on its blocks as its other weights are stored, else as loaded."""
    if isinstance(table, Q4KBlocks) and table.bits == 4:
        return Int4Linear(table, None, build.dtype, kernel=False)
    if isinstance(table, Q4KBlocks | Q32Blocks) and build.blocks is not None:
        return build.blocks(table, None)
    if isinstance(table, Q4KBlocks | Q6KBlocks | Q32Blocks):
        table = build.tensor(torch.from_numpy(table.dequantize()))
    return build.linear(table, None) if build.weight_format == "gguf" else DenseLinear(table, None)


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
