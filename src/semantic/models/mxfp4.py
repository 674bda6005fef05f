"""MXFP4, the format of GPT-OSS's expert weights in its Hugging Face checkpoints: blocks of 32
FP4 (E2M1) values, two to a byte, each block with a shared power-of-two scale (E8M0, bias 127).
Dequantized to float32 on load, as `transformers` dequantizes it on a CPU."""

from __future__ import annotations

import numpy as np

# The 16 E2M1 values, by their 4-bit code (sign in the top bit).
_FP4_VALUES = np.array(
    [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0],
    dtype=np.float32,
)


def dequantize_mxfp4(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """blocks: uint8 [..., G, 16] (a byte holds two values, the low nibble first); scales:
    uint8 [..., G] → float32 [..., G · 32]."""
    if blocks.shape[:-1] != scales.shape or blocks.shape[-1] != 16:
        raise ValueError(f"MXFP4 blocks {blocks.shape} do not fit scales {scales.shape}")
    values = np.empty((*blocks.shape[:-1], 32), dtype=np.float32)
    values[..., 0::2] = _FP4_VALUES[blocks & 0x0F]
    values[..., 1::2] = _FP4_VALUES[blocks >> 4]
    exponents = scales.astype(np.int32) - 127
    values = np.ldexp(values, exponents[..., None]).astype(np.float32)
    return values.reshape(*blocks.shape[:-2], blocks.shape[-2] * 32)
