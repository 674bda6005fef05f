"""Rotary embeddings' inverse frequencies for the scalings the families use: none ("default"),
linear, Llama 3's and YaRN's, as `transformers` computes them (in fp32), for every backend."""

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
    raise ModelLoadFailed(f"rope scaling type {rope_type!r} is not supported")


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
