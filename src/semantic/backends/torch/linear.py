"""y = x Wᵀ + b on the torch backend: how each weight is stored and which kernel runs for how
many rows.

bf16 on CPU, all linears of a SmolLM2-135M step (ms; 2-core Zen 4, torch 2.13; the machine is
shared, so ranges of medians; the 512-row column leaves out the LM head, as prefill does):

    rows                                   1          8          16         512
    our kernel, 16-row panels (one copy)   8.3-9.2    11-15      21-33      -
      its panels unpacked for oneDNN       -          -          -          277-332 (+10 unpack)
    native GEMV (oneDNN off)               9.9-12.9   48-78      -          2900+
    oneDNN, packed at load                 13.5-16.8  14-16      21-30      274-289
    oneDNN, plain weight                   19.6-28    23-34      30-39      272-302

With our kernels (`PanelLinear`) each weight is stored once, in 16-row panels; more rows than
`_PANEL_MAX_ROWS` (long prefill chunks) are unpacked to plain rows in a scratch buffer for
oneDNN. Below that our kernel is faster, unpacking counted, and that is where a returning
agent's turn falls (its new tokens, a few dozen): all of SmolLM2's linears, medians of 9 on a
noisy host, ours against unpack + oneDNN, 28 vs 52 ms at 32 rows, 53 vs 77 at 64, 95 vs 99 at
128, 177 vs 193 at 256. Ours grows ~0.7 ms a row, oneDNN ~0.6 after a ~25 ms unpack, so the
switch sits at 128, short of the crossover, as oneDNN gains most on CPUs with AMX. Moving it
from 16 to 64 rows cut warm time to first token by a third through the server (median of 10
turns of ~30 new tokens: 0.106 → 0.070 s after 2,100 tokens of history, 0.190 → 0.114 s after
4,400). Our kernel gives a row the same bits alone or batched and is closer to fp32 than
oneDNN (mean logit error 0.05-0.27 against 0.08-0.52 on six chat prompts), but the two round
differently, so a step's row count picks a request's bf16 rounding (docs/design.md). Without
our kernels (`OneDnnLinear`), bf16 keeps two copies: one packed for oneDNN at several rows, the
plain one for the native GEMV at one row.

`weights = "int8"` stores each weight in the same panels at one byte a value with an fp32 scale
per output row (`Int8PanelWeight`, `Int8Linear`), and our kernel computes with VNNI's byte dot
product, x quantized to int8 per block of 32 values as it comes in (W8A8, as llama.cpp computes
its quantized weights): twice the multiply-adds of a bf16 instruction and nothing to widen. It
runs at every row count, since it beats unpacking for oneDNN too. The weights of SmolLM2-135M
take 129 MiB instead of 257. Every layer's linears, the LM head left out (ms, medians of 3 on
the quiet host, `benchmarks/runner_microbench.py --weights both --linear-rows 1,4,8,16,128,512`):

    rows                                   1      4      8      16     128    512
    our kernel, bf16 panels                8.1    9.4    14.1   25.1   113    431 (oneDNN)
    our kernel, int8 panels                4.5    5.1    8.1    14.4   65     265

So 1.6-1.9x bf16's speed at every size. The price is accuracy: the logit error against bf16
weights is ~0.33 (9% of the logits' spread) where int8 weights with bf16 x gave ~0.26
(docs/benchmark-history.md).

Without our kernels (CUDA, fp32, no AVX-512 BF16 or VNNI), int8 is `DequantizingLinear`: the
int8 rows and scales kept, the weight dequantized at every call; the memory saved, not the time.

`weights = "gguf"` (the default for a GGUF on the CPU) computes a file's quantized matrices on
their own blocks: with our kernels Q4_K, Q6_K and the per-32 types (Q4_0 .. Q8_0) on our group
kernel (`blocks.py`, `GroupLinear`: 4.5 to 8.5 bits a value, x quantized per group of 32 as for
int8), the file's other matrices in that kernel's 8-bit forms (`_grouped`), at every row count;
without them, Q4_K on torch's int4 kernel (`int4.py`) and the rest in bf16 beside an fp32 model
(`Bf16StoredLinear`).
Qwen2.5-Coder-1.5B Q4_K_M on the 2-vCPU Zen 4 (busy, load ~5; `benchmarks/weights_speed.py
--together --linear-rows 1,4,16`, medians of 3): a decode step reads 997 MiB against int8's
1,475 and bf16's 2,944, and decodes at 9.27 tok/s against 6.56 and 3.58; every linear of a
step (ms):

    rows                                   1      4      16
    bf16 panels                            258    368    934
    int8 rows                              137    192    485
    a GGUF's blocks (gguf)                 93     126    365

A prefill chunk of 512 rows runs at about int8's speed (0.96x; the kernel has a min term and a
conversion more per group and row), faster than bf16 unpacked for oneDNN on this CPU without
AMX (1.46x).

oneDNN builds a kernel for each row count it sees and keeps it (its primitive cache, and
ideep's beside it): about 0.5 MB per weight shape per row count, so a server that prefilled
chunks of every length up to 512 rows kept growing, ~2.4 MB a request at first
(docs/benchmark-history.md, the soak). Rows are therefore padded to a multiple of `_ONEDNN_ROW_STEP`
before oneDNN sees them: 24 row counts past our kernel's 128, seen within minutes of serving. The
padding costs what its rows cost, since the time is about linear in rows here (four of a
layer's weights: 0.34 ms at 17 rows, 0.50 at 32): by that rate ~0.5 ms a padded row over
SmolLM2's 30 layers, ~4 ms a chunk for the 7.5 rows of padding of an average one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch
import torch.nn.functional as F

from semantic.backends.torch.blocks import GroupLinear, grouped, takes
from semantic.backends.torch.int8 import quantize_rows
from semantic.backends.torch.kernels import CpuKernels, Int8PanelWeight, PanelWeight

_PACK_ROWS_HINT = 64  # oneDNN tunes a packed weight's blocking for this many rows
_PANEL_MAX_ROWS = 128  # our kernel up to here (decodes, warm turns), unpacked for oneDNN above
_ONEDNN_ROW_STEP = 16  # rows for oneDNN are padded to a multiple of this


class Linear(Protocol):
    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x: [T, in] → [T, out]."""
        ...

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows `ids` [T] of W → [T, in]: the embedding lookup of a tied model."""
        ...

    @property
    def nbytes(self) -> int:
        """Memory the weights take, every copy counted."""
        ...


LinearFactory = Callable[[torch.Tensor, torch.Tensor | None], Linear]


class DenseLinear:
    """`F.linear` on the weight as loaded: fp32, fp16, CUDA."""

    __slots__ = ("bias", "weight")

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        self.weight = weight  # [out, in]
        self.bias = bias

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.weight)

    @property
    def nbytes(self) -> int:
        return _nbytes(self.weight, self.bias)


class OneDnnLinear(DenseLinear):
    """bf16 on CPU without our kernels: a oneDNN-packed copy for several rows, and the plain
    weight for PyTorch's native GEMV at one row, which `F.linear` takes only while oneDNN is
    switched off."""

    __slots__ = ("packed",)

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__(weight, bias)
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight, _PACK_ROWS_HINT)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] > 1:
            padded = _padded_rows(x)
            y = torch.ops.mkldnn._linear_pointwise(padded, self.packed, self.bias, "none", [], "")
            return y[: x.shape[0]]
        # The process-wide flag, set and restored directly: `torch.backends.mkldnn.flags()`
        # costs ~10 µs a call and warns.
        enabled = torch._C._get_mkldnn_enabled()
        torch._C._set_mkldnn_enabled(False)
        try:
            return F.linear(x, self.weight, self.bias)
        finally:
            torch._C._set_mkldnn_enabled(enabled)

    @property
    def nbytes(self) -> int:
        return super().nbytes + self.packed.numel() * self.packed.element_size()


class Bf16StoredLinear:
    """A weight kept in bf16 where the model computes in fp32 (`weights = "gguf"`: the tensors
    not in Q4_K, on a CPU without AVX-512 BF16), half fp32's bytes. One row (a single stream's
    decode) runs PyTorch's bf16 GEMV, x rounded to bf16; more rows widen the weight to fp32 a
    slab of output rows at a time for fp32's matmul, since PyTorch's bf16 matmul without
    AVX-512 BF16 is slower than fp32's from a few rows on. 8960×1536, ms, fastest of 7 on the
    2-vCPU AVX2 EPYC, one thread, the host busy (load ~10 on 2 CPUs, so only the ratios hold):

        rows                        1      4      16     128    512
        fp32 F.linear               14.1   61     93     280    761
        bf16 F.linear               3.6    45     134    916    4978
        bf16 widened in slabs       21     37     47     134    476
    """

    __slots__ = ("bias", "weight")

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        self.weight = weight.to(torch.bfloat16)  # [out, in]
        self.bias = bias

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] == 1:
            y = F.linear(x.to(torch.bfloat16), self.weight).to(x.dtype)
            return y if self.bias is None else y.add_(self.bias)
        return matmul_by_slabs(x, self.weight.shape[0], self._widened, self.bias)

    def _widened(self, rows: slice) -> torch.Tensor:
        return self.weight[rows].float()

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        return self.weight[ids].float()

    @property
    def nbytes(self) -> int:
        return _nbytes(self.weight, self.bias)


SLAB_ROWS = 256  # output rows widened at once: 1.5 MiB of fp32 at 1536 inputs, in cache


def matmul_by_slabs(
    x: torch.Tensor,
    out_features: int,
    weight_rows: Callable[[slice], torch.Tensor],
    bias: torch.Tensor | None,
) -> torch.Tensor:
    """x [T, in] @ Wᵀ (+ bias) → [T, out], `SLAB_ROWS` output rows at a time, each slab of W
    made by `weight_rows` just before its matmul (still in cache when the matmul reads it)."""
    y = x.new_empty(x.shape[0], out_features)
    for start in range(0, out_features, SLAB_ROWS):
        end = min(out_features, start + SLAB_ROWS)
        torch.matmul(x, weight_rows(slice(start, end)).t(), out=y[:, start:end])
    return y if bias is None else y.add_(bias)


class UnpackScratch:
    """One buffer that `PanelLinear`s unpack a weight into for oneDNN, shared by a model's
    linears: a weight's plain rows are dead once its matmul returns. Grows to the largest."""

    def __init__(self) -> None:
        self.buffer = torch.empty(0, dtype=torch.bfloat16)

    def plain(self, n: int, k: int) -> torch.Tensor:
        if self.buffer.numel() < n * k:
            self.buffer = torch.empty(n * k, dtype=torch.bfloat16)
        return self.buffer[: n * k].view(n, k)


class PanelLinear:
    """bf16 on CPU with our kernels: one copy, in 16-row panels. Up to `_PANEL_MAX_ROWS` rows
    our kernel streams it once for all rows; more rows (prefill) unpack it to bf16 for
    oneDNN."""

    __slots__ = ("bias", "kernels", "scratch", "weight")

    def __init__(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        kernels: CpuKernels,
        scratch: UnpackScratch,
    ) -> None:
        self.weight = PanelWeight.pack(weight)
        self.bias = bias
        self.kernels = kernels
        self.scratch = scratch

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] <= _PANEL_MAX_ROWS:
            return self.kernels.linear(x, self.weight, self.bias)
        w = self.weight
        plain = self.kernels.unpack(w, self.scratch.plain(w.out_features, w.in_features))
        return F.linear(_padded_rows(x), plain, self.bias)[: x.shape[0]]

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        return self.weight.rows(ids)

    @property
    def nbytes(self) -> int:
        return _nbytes(self.weight.panels, self.bias)


class Int8Linear:
    """int8 on CPU with our kernels: the weight in 16-row panels at a byte a value and a scale
    per output row, our kernel at every row count (x quantized per block of 32 values)."""

    __slots__ = ("bias", "kernels", "weight")

    def __init__(
        self, weight: torch.Tensor, bias: torch.Tensor | None, kernels: CpuKernels
    ) -> None:
        self.weight = Int8PanelWeight.pack(weight)
        self.bias = bias
        self.kernels = kernels

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.kernels.linear(x, self.weight, self.bias)

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        return self.weight.rows(ids)

    @property
    def nbytes(self) -> int:
        return _nbytes(self.weight.panels, self.weight.scales, self.bias)


class DequantizingLinear:
    """int8 weights without our kernels (CUDA, fp32, a CPU without AVX-512 BF16 or VNNI): int8
    rows and a scale per row kept, the weight dequantized to the model dtype at each call, x
    as it is. It saves the memory, not the time: correct everywhere, fast nowhere."""

    __slots__ = ("bias", "dtype", "q", "scales")

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        q, scales = quantize_rows(weight, torch.float32)
        self.q = q  # [out, in] int8
        self.scales = scales[:, None]  # [out, 1] fp32: each value rounded once, as `unpack` does
        self.bias = bias
        self.dtype = weight.dtype

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.rows(slice(None)), self.bias)

    def rows(self, ids: torch.Tensor | slice) -> torch.Tensor:
        return (self.q[ids].float() * self.scales[ids]).to(self.dtype)

    @property
    def nbytes(self) -> int:
        return _nbytes(self.q, self.scales, self.bias)


# "bf16": as loaded, in the model dtype; "int8": see above; "gguf": a GGUF file's Q4_K matrices
# on their own blocks (built by `models/weights.py`): with our kernels in bf16, on our group
# kernel, every other weight in its byte form (`blocks.py`); else on torch's int4 kernel
# (`int4.py`), every other weight stored in bf16 where the model computes in fp32
# (`Bf16StoredLinear`), else as "bf16".
WEIGHT_FORMATS = ("bf16", "int8", "gguf")


def linear_factory(
    device: torch.device, dtype: torch.dtype, kernels: CpuKernels | None, weights: str = "bf16"
) -> LinearFactory:
    """How this runner's linears store and compute: see the module docstring."""
    if weights == "int8":
        return _int8_factory(device, dtype, kernels)
    if weights == "gguf" and device.type == "cpu" and dtype == torch.float32:
        return Bf16StoredLinear
    if weights == "gguf" and device.type == "cpu" and dtype == torch.bfloat16 and kernels:
        return lambda weight, bias: _grouped(weight, bias, kernels)
    if device.type != "cpu" or dtype != torch.bfloat16:
        return DenseLinear
    if kernels is None:
        # oneDNN packs bf16 only on CPUs with AVX-512 (BW, VL, DQ) or AVX-NE-CONVERT; elsewhere
        # (an AVX2-only CPU asked for `--dtype bfloat16`) the weight as loaded still computes.
        return OneDnnLinear if torch.ops.mkldnn._is_mkldnn_bf16_supported() else DenseLinear
    scratch = UnpackScratch()
    return lambda weight, bias: PanelLinear(weight, bias, kernels, scratch)


def _int8_factory(
    device: torch.device, dtype: torch.dtype, kernels: CpuKernels | None
) -> LinearFactory:
    if device.type != "cpu" or dtype != torch.bfloat16 or kernels is None:
        return DequantizingLinear
    return lambda weight, bias: Int8Linear(weight, bias, kernels)


def _grouped(weight: torch.Tensor, bias: torch.Tensor | None, kernels: CpuKernels) -> Linear:
    """A GGUF's matrix not on its own blocks (a float one, or a fused one of two kinds,
    dequantized) beside its block ones: in 8-bit groups on the same kernel where its width
    allows (`blocks.grouped`), else in int8 rows."""
    if takes(weight.shape):
        return GroupLinear(grouped(weight), bias, kernels)
    return Int8Linear(weight, bias, kernels)


def _padded_rows(x: torch.Tensor) -> torch.Tensor:
    """x [T, in] with zero rows added up to a multiple of `_ONEDNN_ROW_STEP`."""
    missing = -x.shape[0] % _ONEDNN_ROW_STEP
    return F.pad(x, (0, 0, 0, missing)) if missing else x


def _nbytes(*tensors: torch.Tensor | None) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)
