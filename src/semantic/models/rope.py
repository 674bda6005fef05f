"""Rotary embeddings' inverse frequencies for the scalings the families use: none ("default"),
linear, Llama 3's, YaRN's and LongRoPE's, as `transformers` computes them (in fp32), for every
backend; and partial rotary (Phi-4-mini), which the backends' full-head rope computes through
`rope_frequencies` and `rotary_order`."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from semantic.errors import ModelLoadFailed


def rope_inv_freq(
    head_dim: int, theta: float, scaling: dict[str, Any] | None
) -> tuple[np.ndarray, float]:
    """Inverse frequencies [D/2] fp32 and the factor on cos and sin, for a rope type."""
    inv_freq = 1.0 / _powers(theta, head_dim)
    scaling = scaling or {}
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    if rope_type == "default":
        return inv_freq, 1.0
    if rope_type == "linear":
        return (inv_freq / np.float32(scaling["factor"])).astype(np.float32), 1.0
    if rope_type == "llama3":
        return _llama3_inv_freq(inv_freq, scaling), 1.0
    if rope_type == "yarn":
        return _yarn_inv_freq(head_dim, theta, scaling)
    if rope_type == "longrope":
        return _longrope_inv_freq(head_dim, theta, scaling)
    raise ModelLoadFailed(f"rope scaling type {rope_type!r} is not supported")


def rope_frequencies(
    head_dim: int, theta: float, scaling: dict[str, Any] | None, rotary_dim: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Inverse frequencies [D/2] fp32 and the factor on each one's cos and sin [D/2], for a
    head of `head_dim` dims whose first `rotary_dim` rotate (all when None).

    The backends rotate pairs (i, i + D/2) of a whole head. Partial rotary rotates pairs
    (i, i + R/2) of the first R dims and passes the rest through; in a head whose dims are in
    `rotary_order` (its q and k rows reordered at load) those pairs sit D/2 apart, and the
    pairs past R/2 get frequency 0 and factor 1: cos 1, sin 0, passed through unchanged.
    """
    rotary_dim = head_dim if rotary_dim is None else rotary_dim
    _check_rotary_dim(head_dim, rotary_dim)
    inv_freq, attention_factor = rope_inv_freq(rotary_dim, theta, scaling)
    passed = (head_dim - rotary_dim) // 2
    factors = np.full(rotary_dim // 2, attention_factor, np.float32)
    padded = np.concatenate([inv_freq, np.zeros(passed, np.float32)])
    return padded, np.concatenate([factors, np.ones(passed, np.float32)])


def rotary_order(head_dim: int, rotary_dim: int) -> np.ndarray | None:
    """Where each dim of a head goes so that `rope_frequencies`' tables rotate it as partial
    rotary does: the rotated halves' pairs D/2 apart, the passed-through dims beside them (a
    head's order in q and k alike leaves q·k unchanged). None when every dim rotates."""
    _check_rotary_dim(head_dim, rotary_dim)
    if rotary_dim == head_dim:
        return None
    half, passed = rotary_dim // 2, (head_dim - rotary_dim) // 2
    dims = np.arange(head_dim)
    first = [dims[:half], dims[rotary_dim : rotary_dim + passed]]
    second = [dims[half:rotary_dim], dims[rotary_dim + passed :]]
    return np.concatenate(first + second)


def _check_rotary_dim(head_dim: int, rotary_dim: int) -> None:
    if not (0 < rotary_dim <= head_dim and rotary_dim % 2 == 0 and head_dim % 2 == 0):
        raise ModelLoadFailed(
            f"rope over {rotary_dim} of a head's {head_dim} dims is not supported"
        )


def _powers(theta: float, head_dim: int) -> np.ndarray:
    """theta ** (2i / D) for i < D/2, in fp32: the wavelengths' base."""
    exponents = np.arange(0, head_dim, 2, dtype=np.float32) / np.float32(head_dim)
    return (np.float32(theta) ** exponents).astype(np.float32)


def _llama3_inv_freq(inv_freq: np.ndarray, scaling: dict[str, Any]) -> np.ndarray:
    # Llama 3.1: long wavelengths slowed by `factor`, short kept, the band between blended.
    factor = np.float32(scaling["factor"])
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    old_len = scaling["original_max_position_embeddings"]
    wavelen = np.float32(2 * math.pi) / inv_freq
    scaled = np.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < old_len / high) & ~(wavelen > old_len / low)
    return np.where(medium, blended, scaled).astype(np.float32)


def _yarn_inv_freq(
    head_dim: int, theta: float, scaling: dict[str, Any]
) -> tuple[np.ndarray, float]:
    """YaRN (GPT-OSS, Qwen's long-context configs): frequencies above a band extrapolate,
    below it interpolate by `factor`, blended linearly across it; cos and sin are scaled by
    0.1·ln(factor) + 1 unless `attention_factor` says otherwise."""
    factor = scaling["factor"]
    original = scaling["original_max_position_embeddings"]
    attention_factor = scaling.get("attention_factor")
    if attention_factor is None:
        mscale, mscale_all = scaling.get("mscale"), scaling.get("mscale_all_dim")
        if mscale and mscale_all:
            attention_factor = _yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all)
        else:
            attention_factor = _yarn_mscale(factor)
    beta_fast, beta_slow = scaling.get("beta_fast") or 32, scaling.get("beta_slow") or 1

    def correction_dim(rotations: float) -> float:
        return head_dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001  # no singularity
    steps = np.arange(head_dim // 2, dtype=np.float32)
    ramp = np.clip((steps - np.float32(low)) / np.float32(high - low), 0, 1)
    pos_freqs = _powers(theta, head_dim)
    extrapolation, interpolation = 1.0 / pos_freqs, 1.0 / (np.float32(factor) * pos_freqs)
    keep = 1 - ramp  # the share of each frequency that extrapolates
    blended = interpolation * (1 - keep) + extrapolation * keep
    return blended.astype(np.float32), float(attention_factor)


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _longrope_inv_freq(
    head_dim: int, theta: float, scaling: dict[str, Any]
) -> tuple[np.ndarray, float]:
    """LongRoPE (Phi-3): each frequency divided by a factor of its own, from `long_factor`
    where the config is served past its original context (`long`, set by `ModelConfig`), else
    from `short_factor`; cos and sin scaled by √(1 + ln(factor) / ln(original context)) unless
    `attention_factor` says otherwise."""
    chosen = scaling["long_factor"] if scaling.get("long") else scaling["short_factor"]
    factors = np.asarray(chosen, dtype=np.float32)
    if factors.shape != (head_dim // 2,):
        raise ModelLoadFailed(
            f"LongRoPE has {factors.size} factors for a rotary dim of {head_dim} "
            f"({head_dim // 2} needed)"
        )
    factor, original = scaling["factor"], scaling["original_max_position_embeddings"]
    attention_factor = scaling.get("attention_factor")
    if attention_factor is None:
        growth = math.log(factor) / math.log(original) if factor > 1 else 0.0
        attention_factor = math.sqrt(1 + growth)
    inv_freq = 1.0 / (factors * _powers(theta, head_dim))
    return inv_freq.astype(np.float32), float(attention_factor)
