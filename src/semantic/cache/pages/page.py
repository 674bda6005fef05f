"""One page's K and V as host arrays: what a runner copies out of its pool for the disk tier and
takes back on a restore, and the arrays (names, shapes, dtypes) a cache geometry gives a page."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from semantic.core import CacheSpec

# The arrays of a quantized page beyond K and V, in the order block files checksum them.
SCALE_NAMES = ("k_scales", "v_scales")


@dataclass(slots=True, frozen=True)
class PageKV:
    """K and V of one page's layers, `[layers_per_group, block_tokens, kv_heads, head_dim]`:
    in the cache's dtype (bf16 and fp16 as their raw `np.uint16` bits: numpy has no bf16), or
    for an 8-bit cache as int8 with `k_scales` and `v_scales` `[layers_per_group, block_tokens,
    kv_heads]` (bf16 bits), a row's values being its integers times its scale. The scales are
    None for an unquantized cache."""

    k: np.ndarray
    v: np.ndarray
    k_scales: np.ndarray | None = None
    v_scales: np.ndarray | None = None

    def arrays(self) -> dict[str, np.ndarray]:
        """Every array by the name a block file gives it: k, v, then the scales if any."""
        named = {"k": self.k, "v": self.v}
        if self.k_scales is not None and self.v_scales is not None:
            named.update(zip(SCALE_NAMES, (self.k_scales, self.v_scales), strict=True))
        return named

    @classmethod
    def from_arrays(cls, named: dict[str, np.ndarray]) -> PageKV:
        return cls(named["k"], named["v"], named.get("k_scales"), named.get("v_scales"))


ArrayLayout = tuple[tuple[int, ...], np.dtype]  # an array's shape and dtype


def page_layout(spec: CacheSpec) -> dict[str, ArrayLayout]:
    """The arrays a page of `spec` holds, by name: each one's shape and numpy dtype."""
    rows = (spec.layers_per_group, spec.block_tokens, spec.num_kv_heads)
    values = (*rows, spec.head_dim)
    bits16 = np.dtype(np.uint16)
    if spec.kv_dtype is None:
        dtype = np.dtype(np.float32) if spec.dtype == "float32" else bits16
        return {"k": (values, dtype), "v": (values, dtype)}
    layout: dict[str, ArrayLayout] = {name: (values, np.dtype(np.int8)) for name in ("k", "v")}
    layout.update({name: (rows, bits16) for name in SCALE_NAMES})
    return layout
