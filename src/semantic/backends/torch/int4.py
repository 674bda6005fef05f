"""4-bit weights on the torch backend's CPU: a GGUF file's Q4_K matrices computed on the values
the file holds (`weights = "gguf"`), through torch's own int4 kernel.

torch's CPU kernel (`_weight_int4pack_mm_for_cpu`, x in bf16) computes each weight as
`(q − 8) · scale + zero` per group of 32 input values, with the scale and zero in bf16. A Q4_K
group is `scale · q − min` (`models/q4k.py`), so it maps exactly, up to rounding the group's
scale `d·sc` and its zero `8·scale − dmin·m` to bf16's 8 significant bits (2⁻⁸ of each at most;
the quantization's own step is 1/15 of a group's range). Decode reads 4 bits a value where fp32
reads 32.

One 8960×1536 weight on a 2-vCPU AMD EPYC (AVX2, no AVX-512), torch 2.13, the model dtype fp32,
ms a call, one thread, fastest of 9 (the host shared, load average ~4 on its 2 CPUs):

    rows                              1      8      16     32     64     128    256    512
    fp32 F.linear (the loaded weight) 8.2    18.8   25.5   35.6   47.5   88.3   145    290
    int4 kernel, x in bf16            2.1    6.0    12.8   27.4   49.9   193    215    640
    dequantized slabs + fp32 matmul   21.5   19.2   32.5   33.7   39.9   63.9   158    254

(Two threads, medians at a quieter moment: 1 row 6.4 / 1.4 ms; 64 rows 36-46 / 37 / 45-64.)
The kernel grows ~0.8 ms a row where an fp32 matmul grows ~0.5, so longer chunks take the other
path: the weight dequantized to the model's dtype a slab of output rows at a time (a slab stays
in cache between its dequantization and its matmul: `linear.matmul_by_slabs`), about the fp32
matmul's own time. The switch sits at `_KERNEL_MAX_ROWS`, short of where the two meet. For that
path the values are kept a second time, ours (`nibbles`: a row's first half in the low nibbles,
its second half in the high, so each half unpacks contiguously), since torch's packed layout
differs by CPU (rows interleaved in blocks of 32 on AVX2): 1.125 bytes a value in all, against
fp32's 4.
"""

from __future__ import annotations

import torch

from semantic.backends.torch.linear import matmul_by_slabs
from semantic.models.q4k import GROUP, Q4KBlocks

_KERNEL_MAX_ROWS = 32  # torch's int4 kernel up to here (decodes, short turns), slabs above
_PACK_ROWS = 4096  # rows packed at once at load (torch packs from int32: 4 bytes a value)
_KERNEL_DTYPE = torch.bfloat16  # the only x dtype the CPU kernel is fast for (fp32 x: 13x)


class Int4Linear:
    """A Q4_K matrix as torch's int4 kernel reads it (`packed`, `scales_zeros` [groups, out, 2]
    bf16) and as our slabs unpack it (`nibbles` [out, in / 2] uint8); y in the model's dtype.
    Both copies hold the same values and scales: the two paths differ only in rounding (x to
    bf16 for the kernel, and the order of sums)."""

    __slots__ = ("bias", "dtype", "nibbles", "packed", "scales_zeros")

    def __init__(
        self,
        blocks: Q4KBlocks,
        bias: torch.Tensor | None,
        dtype: torch.dtype,
        *,
        kernel: bool = True,
    ) -> None:
        q = torch.from_numpy(blocks.q)  # [out, in] uint8, 0..15
        scale = torch.from_numpy(blocks.scales).to(_KERNEL_DTYPE)  # [out, groups]
        zero = (8 * scale.float() - torch.from_numpy(blocks.mins)).to(_KERNEL_DTYPE)
        self.scales_zeros = torch.stack([scale, zero], -1).transpose(0, 1).contiguous()
        # An embedding table only has rows read: no packed copy (`kernel=False`).
        self.packed = _pack(q) if kernel else None
        half = q.shape[1] // 2
        self.nibbles = q[:, :half] | (q[:, half:] << 4)
        self.bias = bias
        self.dtype = dtype

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        # x: [T, in] → [T, out]
        if x.shape[0] <= _KERNEL_MAX_ROWS and self.packed is not None:
            xk = x.to(_KERNEL_DTYPE).contiguous()
            y = torch.ops.aten._weight_int4pack_mm_for_cpu(
                xk, self.packed, GROUP, self.scales_zeros
            )
            y = y.to(self.dtype)
            return y if self.bias is None else y.add_(self.bias)

        return matmul_by_slabs(x, self.nibbles.shape[0], self._dequantized, self.bias)

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        return self._dequantized(ids)

    def dequantized(self) -> torch.Tensor:
        """W [out, in] in the model's dtype, as the slabs compute it."""
        return self._dequantized(slice(None))

    def _dequantized(self, rows: torch.Tensor | slice) -> torch.Tensor:
        """Rows `rows` of W: q · scale + (zero − 8 · scale), in fp32, rounded once."""
        nibbles = self.nibbles[rows]  # [n, in / 2]
        scale_zero = self.scales_zeros[:, rows].float()  # [groups, n, 2]
        scale = scale_zero[..., 0].t()  # [n, groups]
        offset = scale_zero[..., 1].t() - 8 * scale
        n, half = nibbles.shape
        groups = half // GROUP
        weight = torch.empty(n, 2 * half, dtype=self.dtype)
        halves = weight.view(n, 2, groups, GROUP)
        for i, values in enumerate((nibbles & 0x0F, nibbles >> 4)):
            parts = slice(i * groups, (i + 1) * groups)
            torch.mul(values.view(n, groups, GROUP), scale[:, parts, None], out=halves[:, i])
        weight.view(n, 2 * groups, GROUP).add_(offset[..., None])
        return weight

    @property
    def nbytes(self) -> int:
        tensors = (self.packed, self.nibbles, self.scales_zeros, self.bias)
        return sum(t.numel() * t.element_size() for t in tensors if t is not None)


def _pack(q: torch.Tensor) -> torch.Tensor:
    """q [out, in] uint8 → torch's packed int4 [out, in / 2], a slab of rows at a time (the
    layout interleaves blocks of rows, so slabs of whole blocks concatenate)."""
    slabs = [
        torch.ops.aten._convert_weight_to_int4pack_for_cpu(q[i : i + _PACK_ROWS].int(), 1)
        for i in range(0, q.shape[0], _PACK_ROWS)
    ]
    return torch.cat(slabs) if len(slabs) > 1 else slabs[0]


def runs_int4(blocks: Q4KBlocks, device: torch.device) -> bool:
    """Whether this matrix computes on torch's CPU int4 kernel here: a Q4_K (not a Q5_K's five
    bits) on the CPU, in a shape the kernel takes (rows in 16s, inputs in 64s: two halves of
    whole groups)."""
    rows, cols = blocks.shape
    shaped = rows % 16 == 0 and cols % (2 * GROUP) == 0
    return blocks.bits == 4 and device.type == "cpu" and shaped
