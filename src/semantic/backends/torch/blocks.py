"""Weights in quantized groups on our AVX-512 kernels (`weights = "gguf"` where they run): a GGUF
file's Q4_K, Q5_K, Q6_K, Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0 matrices computed on the values and
factors the file holds, and any other matrix in one of those layouts with a byte a value.

A Q4_K group is 32 inputs of one output row, `scale · u − min`, scale = d · sc and min = dmin ·
m, with d and dmin fp32 per 256 inputs of the row and sc, m one byte each per group: the file's
4-bit values and 6-bit codes (`models/q4k.py`) bit for bit, at 4.75 bits a value (its fp16 d
and dmin widened); a Q5_K group the same with a plane of fifth bits as the per-32 Q5 types'
(below), at 5.75 bits. A Q6_K half-group of 16 is `scale · (u − 32)`, scale = d · sc: its 6-bit
values as low nibbles (laid out as Q4_K's) and top two bits four to a byte, sc (int8) and d
(`models/q6k.py`), at 6.75 bits. Any other matrix is quantized per group of 32 to int8
(symmetric: u = q + 128, min = 128 · scale), its group scales rounded up to multiples of the
row's d = the block's largest scale / 255: 8.75 bits a value, each within half its own group's
step (a Q4_K or Q6_K value of a fused projection whose parts differ moves by about an eighth of
the file's own step).

The per-32 types (`models/q32.py`: `d · (u − offset) + m` per group of 32, d and m fp16 of the
group's own) keep their values in the same planes, 4 of nibbles, 5 (those and a plane of fifth
bits: input 32g + 4v + b's in bit v, input 32g + 16 + 4v + b's in bit 4 + v) or 8 of bytes, and
their fp16 d (and m) beside them (`FlatWeight`): the file's own 4.5 to 8.5 bits a value, any K
a multiple of 32. A float matrix whose K is no multiple of 256 takes Q8_0's form (`FlatWeight.
quantize`). The kernel (`kernels/block_linear.cpp`) quantizes x to int8 (a step per 256 inputs
for the K-quants and the byte form, finer for small groups of 32; per group of 32 for the
per-32 types) and takes VNNI's byte dot products, a row's result the same alone or batched.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from semantic.backends.torch.kernels import CpuKernels
from semantic.models.q4k import GROUP, SUPER, Q4KBlocks
from semantic.models.q6k import Blocks, Q6KBlocks
from semantic.models.q32 import Q32Blocks

PANEL = 16  # output rows per panel
_GROUPS_PER_SUPER = SUPER // GROUP
_LEVELS = 127  # int8 values of the byte form: -127..127
_CODES = 255  # the byte form's group codes: 1..255 (0 for an all-zero group)
_TINY = torch.finfo(torch.float32).tiny
_SLAB_PANELS = 64  # panels quantized at once: 1024 rows
_BYTE_OFFSET = 128  # the byte form's u = q + 128


@dataclass(slots=True, frozen=True)
class GroupWeight:
    """A weight [N, K] (K a multiple of 256) in the kernel's layout, P = ceil(N/16) panels of 16
    rows: `values` uint8 [P, K/32, planes, 16, 4], 4 planes of nibbles for Q4_K (the low nibble
    input 32g + 4v + b, the high one 16 inputs on), those and one of fifth bits for Q5_K (as
    `FlatWeight`'s Q5), those and 2 of top bit pairs for Q6_K (input 32g + 16h + 4v + b's in
    bits 2v of plane 4 + h), or 8 of bytes (input 32g + 4v + b);
    `codes` uint8 [P, K/32, 2, 16] (sc, m; Q6_K: each half's sc, int8); `supers` fp32 [P,
    K/256, 2, 16] (d, dmin; Q6_K: d, zeros). Padding rows are zero."""

    values: torch.Tensor
    codes: torch.Tensor
    supers: torch.Tensor
    out_features: int
    in_features: int

    @classmethod
    def from_q4k(cls, blocks: Q4KBlocks) -> GroupWeight:
        """A Q4_K (or Q5_K) matrix's blocks as they are: nibbles (and fifth bits), codes, d and
        dmin."""
        n, k = blocks.shape
        q = _panel_rows(torch.from_numpy(blocks.q))
        planes = _nibble_planes(q, k, fifth=blocks.bits == 5)
        codes = _interleaved(torch.from_numpy(blocks.sc), torch.from_numpy(blocks.m))
        supers = _interleaved(torch.from_numpy(blocks.d), torch.from_numpy(blocks.dmin))
        return cls(_panel_major(planes), codes, supers, n, k)

    @classmethod
    def from_q6k(cls, blocks: Q6KBlocks) -> GroupWeight:
        """A Q6_K matrix's blocks as they are: u's low nibbles as Q4_K's, its top two bits four
        to a byte, each half's sc (int8, in `codes`) and d (dmin zero)."""
        n, k = blocks.shape
        u = _panel_rows(torch.from_numpy(blocks.u)).view(-1, PANEL, k // GROUP, 2, 4, 4)
        low = u & 0x0F
        nibbles = low[:, :, :, 0] | (low[:, :, :, 1] << 4)  # [P, 16, G, 4, 4]
        top = (u >> 4).view(-1, PANEL, k // GROUP, 2, 4, 4)  # [P, 16, G, h, v, b]
        shifts = torch.tensor([0, 2, 4, 6], dtype=torch.uint8).view(4, 1)
        pairs = (top << shifts).sum(4, dtype=torch.uint8)  # [P, 16, G, h, b]: v's in bits 2v
        planes = torch.cat([nibbles, pairs], 3)  # [P, 16, G, 6, 4]
        sc = torch.from_numpy(blocks.sc).view(torch.uint8).view(n, -1, 2)
        codes = _interleaved(sc[..., 0], sc[..., 1])
        d = torch.from_numpy(blocks.d)
        supers = _interleaved(d, torch.zeros_like(d))
        return cls(_panel_major(planes), codes, supers, n, k)

    @classmethod
    def quantize(cls, weight: torch.Tensor) -> GroupWeight:
        """Any float weight [N, K] in the byte form (see the module docstring), a slab of
        panels at a time (a slab's temporaries stay in cache: ~10x faster for an LM head)."""
        n, k = weight.shape
        rows = _panel_rows(weight)
        panels = rows.shape[0] // PANEL
        values = torch.empty(panels, k // GROUP, 8, PANEL, 4, dtype=torch.uint8)
        codes = torch.empty(panels, k // GROUP, 2, PANEL, dtype=torch.uint8)
        supers = torch.empty(panels, k // SUPER, 2, PANEL)
        for start in range(0, panels, _SLAB_PANELS):
            end = min(panels, start + _SLAB_PANELS)
            slab = rows[start * PANEL : end * PANEL]
            values[start:end], codes[start:end], supers[start:end] = _quantized(slab)
        return cls(values, codes, supers, n, k)

    @property
    def planes(self) -> int:
        """64-byte planes a group takes: 4 (Q4_K), 5 (Q5_K), 6 (Q6_K) or 8 (the byte form)."""
        return int(self.values.shape[2])

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.values, self.codes, self.supers))

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows `ids` [T] dequantized → [T, K] fp32: scale · u − min, each product rounded once
        (a tied model's embedding lookup; the tests' reference)."""
        panel, lane = ids // PANEL, ids % PANEL
        values = self.values[panel, :, :, lane]  # [T, G, planes, 4]
        codes = self.codes[panel, :, :, lane]  # [T, G, 2]
        supers = self.supers[panel, :, :, lane].repeat_interleave(_GROUPS_PER_SUPER, 1)
        u = _unpacked_values(values)
        if self.planes == 6:  # each half's scale · (u − 32)
            shifts = torch.tensor([0, 2, 4, 6], dtype=torch.uint8).view(4, 1)
            top = (values[:, :, 4:, None] >> shifts) & 0x03  # [T, G, h, v, b]
            u = (u.view(*top.shape[:2], 2, 4, 4) | (top << 4)).float()
            u = u.view(len(ids), -1, 2, GROUP // 2) - 32
            scale = supers[..., 0, None] * codes.view(torch.int8).float()  # [T, G, 2]
            return (scale[..., None] * u).flatten(1)
        u = u.reshape(len(ids), -1, GROUP).float()
        scale, minimum = supers[..., 0] * codes[..., 0], supers[..., 1] * codes[..., 1]
        return (u * scale[..., None] - minimum[..., None]).flatten(1)


@dataclass(slots=True, frozen=True)
class FlatWeight:
    """A weight [N, K] (K a multiple of 32) in per-32 blocks in the kernel's layout, P =
    ceil(N/16) panels of 16 rows: `values` uint8 [P, K/32, planes, 16, 4], 4 planes of nibbles
    (as Q4_K's), 5 (those and the fifth bits, see the module docstring) or 8 of bytes;
    `factors` float16 [P, K/32, 1 or 2, 16], each group's d (then m). value = d · (u − offset)
    + m. Padding rows are zero."""

    values: torch.Tensor
    factors: torch.Tensor
    offset: int
    out_features: int
    in_features: int

    @classmethod
    def from_blocks(cls, blocks: Q32Blocks) -> FlatWeight:
        """A per-32 matrix's blocks as they are: its values, d and m."""
        n, k = blocks.shape
        u = _panel_rows(torch.from_numpy(blocks.u))
        if blocks.bits == 8:
            planes = u.view(-1, PANEL, k // GROUP, 8, 4)
        else:
            planes = _nibble_planes(u, k, fifth=blocks.bits == 5)
        d = torch.from_numpy(blocks.d)
        factors = [d] if blocks.m is None else [d, torch.from_numpy(blocks.m)]
        return cls(_panel_major(planes), _stacked(factors), blocks.offset, n, k)

    @classmethod
    def quantize(cls, weight: torch.Tensor) -> FlatWeight:
        """Any float weight [N, K] as Q8_0 holds one: per group of 32, d = the largest |w| /
        127 in fp16, each value rounded to its nearest multiple of d."""
        n, k = weight.shape
        groups = _panel_rows(weight.float()).view(-1, k // GROUP, GROUP)
        d = (groups.abs().amax(-1) / _LEVELS).half()
        step = d.float().clamp(min=_TINY)[..., None]
        q = (groups / step).round_().clamp_(-_LEVELS, _LEVELS).add_(_BYTE_OFFSET)
        planes = q.to(torch.uint8).view(-1, PANEL, k // GROUP, 8, 4)
        return cls(_panel_major(planes), _stacked([d[:n]]), _BYTE_OFFSET, n, k)

    @property
    def planes(self) -> int:
        """64-byte planes a group takes: 4 (Q4_0, Q4_1), 5 (Q5_0, Q5_1) or 8 (Q8_0)."""
        return int(self.values.shape[2])

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.values, self.factors))

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows `ids` [T] dequantized → [T, K] fp32, as `Q32Blocks.dequantize` computes them
        (a tied model's embedding lookup; the tests' reference)."""
        panel, lane = ids // PANEL, ids % PANEL
        values = self.values[panel, :, :, lane]  # [T, G, planes, 4]
        factors = self.factors[panel, :, :, lane].float()  # [T, G, 1 or 2]
        u = _unpacked_values(values).reshape(len(ids), -1, GROUP).float() - self.offset
        values_f = factors[..., 0, None] * u
        if self.factors.shape[2] == 2:
            values_f = values_f + factors[..., 1, None]
        return values_f.flatten(1)


def _unpacked_values(values: torch.Tensor) -> torch.Tensor:
    """A row's group planes [T, G, planes, 4] → its values u [T, G, 32] uint8 in input order:
    the bytes (8 planes), or the nibbles' low four bits and, with 5 planes, the fifth bit (6
    planes: Q6_K's low four bits only, its top bits are the caller's)."""
    rows, groups = values.shape[:2]
    if values.shape[2] == 8:
        return values.reshape(rows, groups, GROUP)
    # [T, G, 2 (low, high), 4, 4]: inputs 32g + 16·half + 4v + b
    u = torch.stack([values[:, :, :4] & 0x0F, values[:, :, :4] >> 4], 2)
    if values.shape[2] == 5:
        shifts = torch.arange(8, dtype=torch.uint8).view(2, 4, 1)  # [half, v, 1]
        bits = values[:, :, 4, None, None, :]  # [T, G, 1, 1, 4 (b)]
        u = u | (((bits >> shifts) & 1) << 4)
    return u.reshape(rows, groups, GROUP)


def _nibble_planes(u: torch.Tensor, k: int, *, fifth: bool) -> torch.Tensor:
    """[16·P, K] values in 4 or 5 bits → [P, 16, G, 4 or 5, 4]: the low four bits as Q4_K's
    nibbles, then (`fifth`) a plane of their fifth bits, bit v (low half) or 4 + v (high)."""
    q = u.view(-1, PANEL, k // GROUP, 2, 4, 4)  # [P, 16, G, half, v, b]
    low = q & 0x0F
    nibbles = low[:, :, :, 0] | (low[:, :, :, 1] << 4)  # [P, 16, G, 4, 4]
    if not fifth:
        return nibbles
    shifts = torch.arange(8, dtype=torch.uint8).view(2, 4, 1)
    bits = ((q >> 4) << shifts).sum((3, 4), dtype=torch.uint8)  # [P, 16, G, 4 (b)]
    return torch.cat([nibbles, bits[:, :, :, None]], 3)


def _stacked(factors: list[torch.Tensor]) -> torch.Tensor:
    """[N, G] float16 arrays → [P, G, len, 16]: a panel's 16 rows side by side."""
    pair = torch.stack([_panel_rows(f) for f in factors])  # [F, Np, G]
    return pair.view(len(factors), -1, PANEL, pair.shape[-1]).permute(1, 3, 0, 2).contiguous()


def _quantized(
    rows: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Whole panels' rows [16·p, K] in the byte form: values, codes and supers as laid out."""
    groups = rows.float().view(rows.shape[0], -1, GROUP)
    amax = groups.abs().amax(-1)  # [rows, G]
    d = amax.view(amax.shape[0], -1, _GROUPS_PER_SUPER).amax(-1) / (_LEVELS * _CODES)
    d_group = d.repeat_interleave(_GROUPS_PER_SUPER, 1)
    sc = torch.where(d_group > 0, amax / _LEVELS / d_group, 0.0).ceil_().clamp_(0, _CODES)
    scale = (d_group * sc)[..., None]  # as the kernel computes it, in fp32
    # An all-zero group has scale 0: its values 0 / tiny, not 0 / 0.
    q = (groups / scale.clamp(min=_TINY)).round_().clamp_(-_LEVELS, _LEVELS)
    u = q.add_(128).to(torch.uint8).view(-1, PANEL, groups.shape[1], 8, 4)
    codes = _interleaved(sc.to(torch.uint8), sc.to(torch.uint8))
    return _panel_major(u.contiguous()), codes, _interleaved(d, d * 128)


def _panel_major(planes: torch.Tensor) -> torch.Tensor:
    """[P, 16, G, planes, 4] uint8 (contiguous) → [P, G, planes, 16, 4]: each 4 bytes moved as
    one int32, 4x faster than bytewise."""
    words = planes.view(torch.int32).squeeze(-1)  # [P, 16, G, planes]
    moved = words.permute(0, 2, 3, 1).contiguous()  # [P, G, planes, 16]
    return moved.unsqueeze(-1).view(torch.uint8)


def _panel_rows(rows: torch.Tensor) -> torch.Tensor:
    """[N, ...] with zero rows added up to whole panels."""
    missing = -rows.shape[0] % PANEL
    return F.pad(rows, (0, 0, 0, missing)) if missing else rows


def _interleaved(first: torch.Tensor, second: torch.Tensor) -> torch.Tensor:
    """Two [N, C] arrays of per-row factors → [P, C, 2, 16]: a panel's 16 rows side by side."""
    pair = torch.stack([_panel_rows(first), _panel_rows(second)])  # [2, Np, C]
    return pair.view(2, -1, PANEL, pair.shape[-1]).permute(1, 3, 0, 2).contiguous()


def takes(shape: tuple[int, ...]) -> bool:
    """Whether the kernel computes a float weight of this [N, K] shape: K in whole groups of 32
    (in the byte form where in whole blocks of 256, else in Q8_0's)."""
    return shape[1] % GROUP == 0 and shape[1] > 0


def grouped(weight: torch.Tensor) -> GroupWeight | FlatWeight:
    """A float weight [N, K] (`takes`) in the byte form, or Q8_0's where K is no multiple of 256
    (the byte form's d is per 256)."""
    if weight.shape[1] % SUPER == 0:
        return GroupWeight.quantize(weight)
    return FlatWeight.quantize(weight)


class GroupLinear:
    """y = x Wᵀ + b on our kernel over a `GroupWeight`, at every row count; x and y bf16."""

    __slots__ = ("bias", "kernels", "weight")

    def __init__(
        self, weight: GroupWeight | FlatWeight, bias: torch.Tensor | None, kernels: CpuKernels
    ) -> None:
        self.weight = weight
        self.bias = bias
        self.kernels = kernels

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight
        n, bias = w.out_features, self.bias
        if isinstance(w, FlatWeight):
            return self.kernels.flat_linear(x, w.values, w.factors, w.offset, n, bias)
        return self.kernels.block_linear(x, w.values, w.codes, w.supers, n, bias)

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        return self.weight.rows(ids).bfloat16()

    @property
    def nbytes(self) -> int:
        bias = 0 if self.bias is None else self.bias.numel() * self.bias.element_size()
        return self.weight.nbytes + bias


BlockFactory = Callable[[Blocks, torch.Tensor | None], GroupLinear]


def block_factory(
    device: torch.device, dtype: torch.dtype, kernels: CpuKernels | None, weights: str
) -> BlockFactory | None:
    """How a GGUF's block matrices compute on their blocks with our kernels (`weights =
    "gguf"`, bf16 on the CPU), or None where they do not run (then torch's int4 kernel takes
    the Q4_K ones: `int4.py`)."""
    if weights != "gguf" or kernels is None or device.type != "cpu" or dtype != torch.bfloat16:
        return None
    return lambda blocks, bias: GroupLinear(_packed(blocks), bias, kernels)


def _packed(blocks: Blocks) -> GroupWeight | FlatWeight:
    if isinstance(blocks, Q4KBlocks):
        return GroupWeight.from_q4k(blocks)
    if isinstance(blocks, Q6KBlocks):
        return GroupWeight.from_q6k(blocks)
    return FlatWeight.from_blocks(blocks)
