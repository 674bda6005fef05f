"""The MLX backend's KV pool: its arrays, a step's writes into them and reads out of them, and a
page's trip to the host and back (the disk tier's path). K/V are kept in the model's dtype, or in
8 bits with a scale per row (`kv_dtype = "int8"`), the torch backend's format, so a page reads
the same on either backend."""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from semantic.cache.pages.page import PageKV
from semantic.core import CacheSpec

DTYPES = {"bfloat16": mx.bfloat16, "float16": mx.float16, "float32": mx.float32}
_LEVELS = 127  # int8 values are round(x / scale), scale = the row's largest magnitude / 127


class KVPool:
    """The KV cache: for the i-th layer of every layer group, K and V arrays
    `[num_pages · block_tokens, kv_heads, head_dim]`. Row `page · block_tokens + t` holds token
    `t` of a page; a page holds one group's block (with one group, a block of every layer), so
    one page size serves every group, as on the torch backend. Zero-filled, so a padded read of
    a row never written is finite.

    An 8-bit pool holds int8 values and, per row (one token's K or V of one KV head), a bf16
    scale `[num_pages · block_tokens, kv_heads]`: symmetric, the scale rounded to bf16 before
    the values are divided by it (`backends/torch/int8.py` says why per row).

    These arrays ARE the cache: a step writes into them in place (MLX's indexed assignment) and
    no sequence keeps a copy between steps."""

    def __init__(self, spec: CacheSpec, num_pages: int) -> None:
        self.block_tokens = spec.block_tokens
        self.dtype = DTYPES[spec.dtype]
        rows = (num_pages * spec.block_tokens, spec.num_kv_heads)
        stored = mx.int8 if spec.kv_dtype else self.dtype
        per_group = range(spec.layers_per_group)
        self.k = [mx.zeros((*rows, spec.head_dim), stored) for _ in per_group]
        self.v = [mx.zeros((*rows, spec.head_dim), stored) for _ in per_group]
        self.k_scales: list[mx.array] | None = None
        self.v_scales: list[mx.array] | None = None
        if spec.kv_dtype:
            self.k_scales = [mx.zeros(rows, mx.bfloat16) for _ in per_group]
            self.v_scales = [mx.zeros(rows, mx.bfloat16) for _ in per_group]
        mx.eval(self.arrays())
        # layer → (its group, its arrays' index)
        self.where = {
            layer: (group, i)
            for group, layers in enumerate(spec.groups)
            for i, layer in enumerate(layers.layers)
        }

    def _named(self) -> dict[str, list[mx.array]]:
        """Each kind of array a page has rows of, by the name a block file gives it."""
        named = {"k": self.k, "v": self.v}
        if self.k_scales is not None and self.v_scales is not None:
            named.update(k_scales=self.k_scales, v_scales=self.v_scales)
        return named

    def arrays(self) -> list[mx.array]:
        return [array for arrays in self._named().values() for array in arrays]

    def write(self, i: int, slots: mx.array, k: mx.array, v: mx.array) -> None:
        """k, v: [T, KVH, D] into rows `slots` of the i-th layer's arrays (quantized in an
        8-bit pool)."""
        if self.k_scales is None or self.v_scales is None:
            self.k[i][slots] = k
            self.v[i][slots] = v
            return
        for values, scales, x in ((self.k, self.k_scales, k), (self.v, self.v_scales, v)):
            values[i][slots], scales[i][slots] = quantize_rows(x)

    def gather(self, i: int, rows: mx.array) -> tuple[mx.array, mx.array]:
        """The i-th layer's K and V at `rows` (any shape R) → [*R, KVH, D], in the model's
        dtype."""
        if self.k_scales is None or self.v_scales is None:
            return self.k[i][rows], self.v[i][rows]
        return (
            _dequantize(self.k[i][rows], self.k_scales[i][rows], self.dtype),
            _dequantize(self.v[i][rows], self.v_scales[i][rows], self.dtype),
        )

    def _rows(self, page: int) -> slice:
        return slice(page * self.block_tokens, (page + 1) * self.block_tokens)

    def copy_page(self, source: int, destination: int) -> None:
        for array in self.arrays():
            array[self._rows(destination)] = array[self._rows(source)]

    def read_page(self, page: int) -> PageKV:
        """A host copy of one page (`cache/pages/page.py`): 16-bit values and scales as raw bits."""
        rows = self._rows(page)
        named = self._named().items()
        return PageKV.from_arrays(
            {name: _host(mx.stack([a[rows] for a in arrays])) for name, arrays in named}
        )

    def write_page(self, page: int, kv: PageKV) -> None:
        """Fill one page from host arrays as `read_page` gives them."""
        named = self._named()
        if set(kv.arrays()) != set(named):
            raise ValueError("a page of 8-bit values goes only into an 8-bit pool, and back")
        rows = self._rows(page)
        for name, host in kv.arrays().items():
            for i, array in enumerate(named[name]):
                array[rows] = _device(host[i], array.dtype)
        mx.eval(self.arrays())


def quantize_rows(x: mx.array) -> tuple[mx.array, mx.array]:
    """x: [..., D] → (values int8 [..., D], scales bf16 [...]), x ≈ values · scales; each value
    the nearest multiple of the scale as stored (the torch backend's `quantize_rows`)."""
    x32 = x.astype(mx.float32)
    scales = (mx.abs(x32).max(axis=-1) / _LEVELS).astype(mx.bfloat16)
    divisor = scales.astype(mx.float32)[..., None]
    # An all-zero row has a zero scale: its values are 0, not 0 / 0.
    ratio = mx.where(divisor > 0, x32 / mx.where(divisor > 0, divisor, 1), 0)
    return mx.clip(mx.round(ratio), -_LEVELS, _LEVELS).astype(mx.int8), scales


def _dequantize(values: mx.array, scales: mx.array, dtype: mx.Dtype) -> mx.array:
    return (values.astype(mx.float32) * scales.astype(mx.float32)[..., None]).astype(dtype)


def _host(array: mx.array) -> np.ndarray:
    """As numpy: bf16 and fp16 as raw uint16 bits (numpy has no bf16)."""
    if array.dtype in (mx.float32, mx.int8):
        return np.array(array)
    return np.array(array.view(mx.uint16))


def _device(array: np.ndarray, dtype: mx.Dtype) -> mx.array:
    if dtype in (mx.float32, mx.int8):
        return mx.array(np.ascontiguousarray(array))
    return mx.array(np.ascontiguousarray(array, dtype=np.uint16)).view(dtype)
