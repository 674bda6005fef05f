"""Symmetric int8 with a scale per row, for the 8-bit KV cache (`kv_dtype = "int8"`: each
step's K and V as they are written, what the stock attention path gathers) and 8-bit weights
(`weights = "int8"`: a scale per output row, fp32; why per row there: docs/design.md).

For the cache, a row is one token's K (or V) of one KV head, head_dim values; each row has its
own scale, the row's largest magnitude / 127 rounded to bf16, and its values are round(x /
scale) clamped to ±127 (symmetric, no zero point). Why per (token, KV head), not per block:
decode writes a block one token at a time, so a scale fixed by a block's first token cannot
bound the tokens after it without requantizing the whole block on every write; a row's scale is
known the moment the row is, keeps every write local, and follows outliers that differ by token
and head (K rows differ in magnitude by 10x and more across heads). The cost is 2 bytes per
head_dim bytes: 3% at head_dim 64. The scale is rounded to bf16 before the values are divided by
it, so storing it in bf16 loses nothing: the values are exact multiples of the scale that is
stored, and a value at most half a step (0.4% of the largest) from the row's own. Measured
accuracy on SmolLM2-135M: docs/benchmark-history.md (`benchmarks/quant_accuracy.py --setting
kv_dtype=int8`).
"""

from __future__ import annotations

import torch

SCALE_DTYPE = torch.bfloat16
_LEVELS = 127


def quantize_rows(
    x: torch.Tensor, scale_dtype: torch.dtype = SCALE_DTYPE
) -> tuple[torch.Tensor, torch.Tensor]:
    """x: [..., D] → (values int8 [..., D], scales [...] in `scale_dtype`), x ≈ values · scales;
    each value is rounded to the nearest multiple of the scale as stored."""
    x32 = x.float()
    scales = (x32.abs().amax(-1) / _LEVELS).to(scale_dtype)
    divisor = scales.float().unsqueeze(-1)
    # An all-zero row has a zero scale: its values are 0, not 0 / 0.
    ratio = torch.where(divisor > 0, x32 / divisor, 0.0)
    values = ratio.round_().clamp_(-_LEVELS, _LEVELS).to(torch.int8)
    return values, scales


def dequantize_rows(values: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """values int8 [..., D], scales [...] → [..., D] in `dtype` (the product in fp32, rounded
    once)."""
    return (values.float() * scales.float().unsqueeze(-1)).to(dtype)
