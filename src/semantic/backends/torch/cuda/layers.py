"""Triton kernels for a decoder layer's small ops on CUDA: RMSNorm (alone, or fused with the
residual add before it), rope, the KV pool's write (plain or 8-bit), rope (and the q/k norms of
Qwen3 and Gemma 3) fused into that write, and the gated MLP's middle (SwiGLU, GeGLU).

Why: a decode step on a GPU is bound by the CPU launching kernels, not by the GPU running them
(the SmolLM2 shape runs ~20 launches a layer, each a few µs of GPU work). Each fusion here takes
launches and round trips through memory out of every layer:

- `add_rms_norm`: the residual add and the next sublayer's RMSNorm read the same row; stock
  torch is an add plus ~7 ops of the norm, here one kernel that updates the residual stream in
  place and writes the normalised row.
- `rope_write_kv`: rope on q and k, then the KV write (and, in an 8-bit pool, the rows'
  quantization) all read the fused QKV projection's output; one kernel ropes q and k in place
  there and writes the roped k and the v rows into the pool, where stock torch makes ~5 ops of
  rope, a quantization of ~8 ops per pool and two `index_copy_` per pool. Where the family
  normalises each q and k head first, the same kernel does (a head's row is in registers
  already): two RMSNorms and a `cat` fewer.
- `swiglu` / `geglu`: `chunk`, the activation and the product are one pass.

Numerics follow the torch ops they replace: every intermediate torch rounds to the model's
dtype is rounded here too (RMSNorm's normalised row in the Llama/Qwen mode, rope's first
product, SwiGLU's activation), the rest is fp32. Writes, and the 8-bit pool's quantization, are
exact (`int8.quantize_rows` bit for bit: IEEE division, round half to even, the bf16 scale
rounded to nearest even from its fp32 bits); reductions and transcendental functions (RMSNorm's
sum and rsqrt, exp, tanh) may differ from torch's in the last bit of fp32, so after rounding to
bf16 a value can differ by one bf16 step. `tests/unit/test_cuda_layers.py` says which is which.

Every kernel is safe to capture in a CUDA graph: no host syncs, grids and outputs from shapes
only. A negative pool slot is skipped (graph padding rows carry -1). Without a GPU the same
kernels run in Triton's interpreter (the tests set `TRITON_INTERPRET=1`), where bf16 tensors do
not work: the 8-bit pool's bf16 scales are therefore written through an int16 view.

The speed on a GPU is yet to be measured: `benchmarks/cuda_layers.py` times each kernel against
the stock torch ops and counts the launches per layer both ways (in the interpreter, one layer's
small ops are 25 torch ops with a bf16 pool and 53 with an 8-bit one, against 4 launches here).
A Triton launch from Python costs the CPU more than a torch op does, so eager steps gain less
than the count suggests; replayed from a CUDA graph, launches cost nothing on the CPU and the
fusions save the GPU's own per-kernel time and memory round trips.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from semantic.backends.torch.models.layers import QKNorms


@triton.jit
def _round_half_even(r: tl.tensor) -> tl.tensor:
    # torch.round's rounding, from floor alone (exact for these magnitudes): ties go to even.
    down = tl.floor(r)
    frac = r - down
    odd = (down - 2.0 * tl.floor(down * 0.5)) == 1.0
    up = (frac > 0.5) | ((frac == 0.5) & odd)
    return tl.where(up, down + 1.0, down)


@triton.jit
def _quantize_rows(x: tl.tensor) -> tuple[tl.tensor, tl.tensor]:
    """x [R, C] fp32 (padding columns 0) → (int8 values [R, C], bf16 bits of the scales [R]
    as int16), as `int8.quantize_rows` computes them."""
    amax = tl.max(tl.abs(x), axis=1)
    scale = tl.math.div_rn(amax, 127.0)
    # fp32 → bf16, round to nearest even, on the bits (a bf16 tensor cannot be stored from the
    # interpreter); scales are >= 0, so the top 16 bits fit int16.
    bits = scale.to(tl.int32, bitcast=True)
    bf16_bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    divisor = (bf16_bits << 16).to(tl.float32, bitcast=True)[:, None]
    safe = tl.where(divisor > 0, divisor, 1.0)
    ratio = tl.where(divisor > 0, tl.math.div_rn(x, safe), 0.0)
    values = tl.clamp(_round_half_even(ratio), -127.0, 127.0).to(tl.int8)
    return values, bf16_bits.to(tl.int16)


@triton.jit
def _store_pool_rows(
    rows: tl.tensor,
    slot: tl.tensor,
    head: tl.tensor,
    col: tl.tensor,
    mask: tl.tensor,
    cache_ptr: tl.tensor,
    scales_ptr: tl.tensor,
    KV_HEADS: tl.constexpr,
    DIM: tl.constexpr,
    QUANTIZE: tl.constexpr,
) -> None:
    """rows [R, C] fp32, KV heads `head` [R] of one token → pool slot `slot` (skipped when
    negative); `mask` [R, C] the real heads and columns."""
    # broadcast before comparing: a scalar's comparison makes a mask the interpreter rejects
    written = tl.broadcast_to(slot, head.shape) >= 0  # [R]
    keep = mask & written[:, None]
    row = slot * KV_HEADS + head  # int64: pools can pass 2^31 values
    if QUANTIZE:
        values, scale_bits = _quantize_rows(tl.where(mask, rows, 0.0))
        tl.store(cache_ptr + row[:, None] * DIM + col[None, :], values, mask=keep)
        tl.store(scales_ptr + row, scale_bits, mask=(head < KV_HEADS) & written)
    else:
        out = rows.to(cache_ptr.dtype.element_ty)
        tl.store(cache_ptr + row[:, None] * DIM + col[None, :], out, mask=keep)


@triton.jit
def _rope_rows(
    x_ptr: tl.tensor,
    cos_ptr: tl.tensor,
    sin_ptr: tl.tensor,
    offsets: tl.tensor,
    col: tl.tensor,
    mask: tl.tensor,
    HALF: tl.constexpr,
    norm_ptr: tl.tensor = None,
    eps: float = 0.0,
    NORM: tl.constexpr = False,
    ROUND_NORMED: tl.constexpr = True,
) -> tl.tensor:
    """`apply_rope` on rows at `x_ptr + offsets` [R, C] (cos, sin_signed at their columns):
    x·cos rounded to x's dtype, plus swap_halves(x)·sin_signed, in x's dtype. With NORM, each
    row's RMSNorm first (weight at `norm_ptr`, normalised and rounded as `_rms_norm_kernel`
    does): a q/k norm (Qwen3, Gemma 3) and rope in one pass."""
    dtype = x_ptr.dtype.element_ty
    swap = tl.where(col < HALF, col + HALF, col - HALF)
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    swapped = tl.load(x_ptr + offsets - col[None, :] + swap[None, :], mask=mask, other=0.0)
    swapped = swapped.to(tl.float32)
    if NORM:
        inverse = tl.math.rsqrt(tl.math.div_rn(tl.sum(x * x, axis=1), 2 * HALF * 1.0) + eps)
        x = _scaled(x * inverse[:, None], norm_ptr + col, col < 2 * HALF, dtype, ROUND_NORMED)
        swapped = _scaled(
            swapped * inverse[:, None], norm_ptr + swap, col < 2 * HALF, dtype, ROUND_NORMED
        )
    return _rotate(x, swapped, cos_ptr, sin_ptr, col, dtype, HALF)


@triton.jit
def _scaled(
    normed: tl.tensor,
    weight_ptrs: tl.tensor,
    cols: tl.tensor,
    dtype: tl.constexpr,
    ROUND_NORMED: tl.constexpr,
) -> tl.tensor:
    """A normalised row times its weight, rounded to `dtype` (and before, with ROUND_NORMED, as
    Llama and Qwen round), back in fp32."""
    if ROUND_NORMED:
        normed = normed.to(dtype).to(tl.float32)
    weight = tl.load(weight_ptrs, mask=cols, other=0.0).to(tl.float32)
    return (normed * weight[None, :]).to(dtype).to(tl.float32)


@triton.jit
def _rotate(
    x: tl.tensor,
    swapped: tl.tensor,
    cos_ptr: tl.tensor,
    sin_ptr: tl.tensor,
    col: tl.tensor,
    dtype: tl.constexpr,
    HALF: tl.constexpr,
) -> tl.tensor:
    """x·cos rounded to `dtype`, plus swapped·sin_signed, in `dtype` (x, swapped: fp32)."""
    cos = tl.load(cos_ptr + col, mask=col < 2 * HALF, other=0.0).to(tl.float32)
    sin = tl.load(sin_ptr + col, mask=col < 2 * HALF, other=0.0).to(tl.float32)
    first = (x * cos[None, :]).to(dtype).to(tl.float32)
    return (first + swapped * sin[None, :]).to(dtype)


@triton.jit
def _rms_norm_kernel(
    x_ptr: tl.tensor,
    delta_ptr: tl.tensor,
    weight_ptr: tl.tensor,
    out_ptr: tl.tensor,
    x_stride: int,
    delta_stride: int,
    out_stride: int,
    eps: float,
    DIM: tl.constexpr,
    BLOCK: tl.constexpr,
    ADD: tl.constexpr,
    ROUND_NORMED: tl.constexpr,
) -> None:
    # one program per row; with ADD, x += delta first (in x's dtype, written back)
    token = tl.program_id(0).to(tl.int64)
    col = tl.arange(0, BLOCK)
    mask = col < DIM
    x = tl.load(x_ptr + token * x_stride + col, mask=mask, other=0.0).to(tl.float32)
    if ADD:
        delta = tl.load(delta_ptr + token * delta_stride + col, mask=mask, other=0.0)
        summed = (x + delta.to(tl.float32)).to(x_ptr.dtype.element_ty)
        tl.store(x_ptr + token * x_stride + col, summed, mask=mask)
        x = summed.to(tl.float32)
    # IEEE division (div_rn) as torch's; Triton's `/` in fp32 is an approximate one
    normed = x * tl.math.rsqrt(tl.math.div_rn(tl.sum(x * x, axis=0), DIM * 1.0) + eps)
    weight = tl.load(weight_ptr + col, mask=mask, other=0.0).to(tl.float32)
    if ROUND_NORMED:  # Llama, Qwen: weight · normed.to(dtype), the product rounded again
        normed = normed.to(out_ptr.dtype.element_ty).to(tl.float32)
    tl.store(
        out_ptr + token * out_stride + col,
        (normed * weight).to(out_ptr.dtype.element_ty),
        mask=mask,
    )


@triton.jit
def _rope_kernel(
    x_ptr: tl.tensor,
    cos_ptr: tl.tensor,
    sin_ptr: tl.tensor,
    out_ptr: tl.tensor,
    x_token_stride: int,
    x_head_stride: int,
    cos_stride: int,
    sin_stride: int,
    HEADS: tl.constexpr,
    HALF: tl.constexpr,
    HEADS_BLOCK: tl.constexpr,
    DIM_BLOCK: tl.constexpr,
) -> None:
    # one program per token, all its heads
    token = tl.program_id(0).to(tl.int64)
    head = tl.arange(0, HEADS_BLOCK)
    col = tl.arange(0, DIM_BLOCK)
    mask = (head < HEADS)[:, None] & (col < 2 * HALF)[None, :]
    offsets = token * x_token_stride + head[:, None] * x_head_stride + col[None, :]
    out = _rope_rows(
        x_ptr, cos_ptr + token * cos_stride, sin_ptr + token * sin_stride, offsets, col, mask, HALF
    )
    out_offsets = (token * HEADS + head[:, None]) * (2 * HALF) + col[None, :]
    tl.store(out_ptr + out_offsets, out, mask=mask)


@triton.jit
def _write_kv_kernel(
    x_ptr: tl.tensor,
    slots_ptr: tl.tensor,
    cache_ptr: tl.tensor,
    scales_ptr: tl.tensor,
    x_token_stride: int,
    x_head_stride: int,
    KV_HEADS: tl.constexpr,
    DIM: tl.constexpr,
    HEADS_BLOCK: tl.constexpr,
    DIM_BLOCK: tl.constexpr,
    QUANTIZE: tl.constexpr,
) -> None:
    # one program per token, all its KV heads
    token = tl.program_id(0).to(tl.int64)
    head = tl.arange(0, HEADS_BLOCK)
    col = tl.arange(0, DIM_BLOCK)
    mask = (head < KV_HEADS)[:, None] & (col < DIM)[None, :]
    offsets = token * x_token_stride + head[:, None] * x_head_stride + col[None, :]
    rows = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    slot = tl.load(slots_ptr + token)
    _store_pool_rows(rows, slot, head, col, mask, cache_ptr, scales_ptr, KV_HEADS, DIM, QUANTIZE)


@triton.jit
def _rope_write_kv_kernel(
    qkv_ptr: tl.tensor,
    cos_ptr: tl.tensor,
    sin_ptr: tl.tensor,
    slots_ptr: tl.tensor,
    k_cache_ptr: tl.tensor,
    v_cache_ptr: tl.tensor,
    k_scales_ptr: tl.tensor,
    v_scales_ptr: tl.tensor,
    q_norm_ptr: tl.tensor,
    k_norm_ptr: tl.tensor,
    eps: float,
    token_stride: int,
    head_stride: int,
    cos_stride: int,
    sin_stride: int,
    HEADS: tl.constexpr,
    KV_HEADS: tl.constexpr,
    HALF: tl.constexpr,
    HEADS_BLOCK: tl.constexpr,
    KV_BLOCK: tl.constexpr,
    DIM_BLOCK: tl.constexpr,
    QUANTIZE: tl.constexpr,
    NORM: tl.constexpr,
    ROUND_NORMED: tl.constexpr,
) -> None:
    # one program per token: its q and k heads (normed first, with NORM) roped in place, then
    # its k and v rows written
    token = tl.program_id(0).to(tl.int64)
    col = tl.arange(0, DIM_BLOCK)
    cols = col < 2 * HALF
    cos_row = cos_ptr + token * cos_stride
    sin_row = sin_ptr + token * sin_stride
    base = token * token_stride

    head = tl.arange(0, HEADS_BLOCK)
    q_mask = (head < HEADS)[:, None] & cols[None, :]
    q_offsets = base + head[:, None] * head_stride + col[None, :]
    kv_head = tl.arange(0, KV_BLOCK)
    kv_mask = (kv_head < KV_HEADS)[:, None] & cols[None, :]
    k_offsets = base + (HEADS + kv_head[:, None]) * head_stride + col[None, :]
    q = _rope_rows(
        qkv_ptr, cos_row, sin_row, q_offsets, col, q_mask, HALF, q_norm_ptr, eps, NORM, ROUND_NORMED
    )
    k = _rope_rows(
        qkv_ptr,
        cos_row,
        sin_row,
        k_offsets,
        col,
        kv_mask,
        HALF,
        k_norm_ptr,
        eps,
        NORM,
        ROUND_NORMED,
    )
    v_offsets = k_offsets + KV_HEADS * head_stride
    v = tl.load(qkv_ptr + v_offsets, mask=kv_mask, other=0.0)
    # In place: a thread reads the other half of a row, which another thread writes; every
    # read of the block is done before any write.
    tl.debug_barrier()
    tl.store(qkv_ptr + q_offsets, q, mask=q_mask)
    tl.store(qkv_ptr + k_offsets, k, mask=kv_mask)

    slot = tl.load(slots_ptr + token)
    _store_pool_rows(
        k.to(tl.float32),
        slot,
        kv_head,
        col,
        kv_mask,
        k_cache_ptr,
        k_scales_ptr,
        KV_HEADS,
        2 * HALF,
        QUANTIZE,
    )
    _store_pool_rows(
        v.to(tl.float32),
        slot,
        kv_head,
        col,
        kv_mask,
        v_cache_ptr,
        v_scales_ptr,
        KV_HEADS,
        2 * HALF,
        QUANTIZE,
    )


@triton.jit
def _gated_kernel(
    gate_up_ptr: tl.tensor,
    out_ptr: tl.tensor,
    in_stride: int,
    INNER: tl.constexpr,
    BLOCK: tl.constexpr,
    GELU: tl.constexpr,
) -> None:
    # program (token, block of the inner width): act(gate) rounded to the dtype, times up
    token = tl.program_id(0).to(tl.int64)
    col = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = col < INNER
    gate = tl.load(gate_up_ptr + token * in_stride + col, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(gate_up_ptr + token * in_stride + INNER + col, mask=mask, other=0.0)
    z = gate  # SiLU: x·sigmoid(x)
    if GELU:  # tanh-GELU: 0.5·x·(1 + tanh(y)) = x·sigmoid(2y), y = √(2/π)·(x + 0.044715·x³)
        z = 1.5957691216057308 * (gate + 0.044715 * gate * gate * gate)
    # x·sigmoid(z) from e^-|z|, which cannot overflow: x / (1 + e^-z) for z >= 0 (torch's own
    # formula), x·e^z / (1 + e^z) below.
    e = tl.exp(-tl.abs(z))
    act = tl.math.div_rn(tl.where(z >= 0, gate, gate * e), 1.0 + e)
    act = act.to(out_ptr.dtype.element_ty).to(tl.float32)
    out = (act * up.to(tl.float32)).to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + token * INNER + col, out, mask=mask)


class TritonLayers:
    """The small per-layer ops on CUDA tensors, with `CpuKernels`' signatures and semantics
    for `rms_norm`, `rope`, `swiglu` and `write_kv_int8`, so a model's layers can call either;
    plus the fused `add_rms_norm` and `rope_write_kv`, and `write_kv` for both kinds of pool.
    Tensors' last dimension must be contiguous; pools contiguous."""

    def rms_norm(
        self, x: torch.Tensor, weight: torch.Tensor, eps: float, round_normed: bool = True
    ) -> torch.Tensor:
        """x: [T, D] → RMSNorm in fp32, rounded to x's dtype, times `weight` (rounded again);
        with `round_normed` false, times `weight` in fp32 and then rounded (Gemma, GPT-OSS)."""
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        self._rms_norm(x, None, weight, out, eps, round_normed)
        return out

    def add_rms_norm(
        self,
        x: torch.Tensor,
        delta: torch.Tensor,
        weight: torch.Tensor,
        eps: float,
        round_normed: bool = True,
    ) -> torch.Tensor:
        """`x += delta` in place (x: [T, D], the residual stream, rounded to its dtype as
        torch's add rounds) → `rms_norm(x, ...)` of the updated x, in one kernel."""
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        self._rms_norm(x, delta, weight, out, eps, round_normed)
        return out

    def _rms_norm(
        self,
        x: torch.Tensor,
        delta: torch.Tensor | None,
        weight: torch.Tensor,
        out: torch.Tensor,
        eps: float,
        round_normed: bool,
    ) -> None:
        _check_rows(x, 2, "x")
        tokens, dim = x.shape
        if delta is not None:
            _check_rows(delta, 2, "delta")
            if delta.shape != x.shape:
                raise ValueError(f"delta {tuple(delta.shape)} does not match x {tuple(x.shape)}")
        if tokens == 0:
            return
        block = triton.next_power_of_2(dim)
        _rms_norm_kernel[(tokens,)](
            x,
            x if delta is None else delta,
            weight,
            out,
            x.stride(0),
            0 if delta is None else delta.stride(0),
            out.stride(0),
            eps,
            DIM=dim,
            BLOCK=block,
            ADD=delta is not None,
            ROUND_NORMED=round_normed,
            num_warps=_warps(block),
        )

    def rope(self, x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor) -> torch.Tensor:
        """x: [T, N, D] (each token's heads at a stride of their own), cos and sin_signed
        [T, 1, D] → `models.rope.apply_rope(x, cos, sin_signed)` [T, N, D], in one pass."""
        _check_rows(x, 3, "x")
        _check_tables(cos, sin_signed)
        tokens, heads, dim = x.shape
        out = torch.empty((tokens, heads, dim), dtype=x.dtype, device=x.device)
        if tokens == 0:
            return out
        _rope_kernel[(tokens,)](
            x,
            cos,
            sin_signed,
            out,
            x.stride(0),
            x.stride(1),
            cos.stride(0),
            sin_signed.stride(0),
            HEADS=heads,
            HALF=dim // 2,
            HEADS_BLOCK=triton.next_power_of_2(heads),
            DIM_BLOCK=triton.next_power_of_2(dim),
        )
        return out

    def write_kv(
        self,
        x: torch.Tensor,
        slots: torch.Tensor,
        cache: torch.Tensor,
        scales: torch.Tensor | None = None,
    ) -> None:
        """x: [T, KVH, D] → the pool `cache` [blocks, block_tokens, KVH, D] at `slots` [T]
        int64 (page · block_tokens + offset; a negative slot is skipped). With `scales`
        [blocks, block_tokens, KVH] bf16 the pool is 8-bit (int8 `cache`) and each row is
        quantized as `int8.quantize_rows` does. Slots are the engine's, not checked against
        the pool's size: a check would read them on the host, a sync per layer."""
        _check_rows(x, 3, "x")
        tokens, kv_heads, dim = x.shape
        _check_pool(cache, scales, kv_heads, dim)
        if tokens == 0:
            return
        _write_kv_kernel[(tokens,)](
            x,
            slots,
            cache,
            _scale_bits(scales, cache),
            x.stride(0),
            x.stride(1),
            KV_HEADS=kv_heads,
            DIM=dim,
            HEADS_BLOCK=triton.next_power_of_2(kv_heads),
            DIM_BLOCK=triton.next_power_of_2(dim),
            QUANTIZE=scales is not None,
        )

    def write_kv_int8(
        self, x: torch.Tensor, slots: torch.Tensor, cache: torch.Tensor, scales: torch.Tensor
    ) -> None:
        """`CpuKernels.write_kv_int8`'s signature: `write_kv` into an 8-bit pool."""
        self.write_kv(x, slots, cache, scales)

    def rope_write_kv(
        self,
        qkv: torch.Tensor,
        heads: int,
        kv_heads: int,
        cos: torch.Tensor,
        sin_signed: torch.Tensor,
        slots: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        k_scales: torch.Tensor | None = None,
        v_scales: torch.Tensor | None = None,
        qk_norms: QKNorms | None = None,
    ) -> None:
        """The fused projection's output qkv: [T, H + 2·KVH, D] → its q and k heads roped in
        place (as `apply_rope`), and the roped k and the v rows written into the pools at
        `slots` as `write_kv` writes them (quantized when the scales are given; negative
        slots skipped). Afterwards q = qkv[:, :H], k = qkv[:, H : H + KVH] (roped, for the
        chunk's own attention) and v = qkv[:, H + KVH :]. With `qk_norms`, each q and k head
        is RMS-normalised first (`rms_norm`'s rounding). One kernel for what is otherwise
        the q/k norms, rope, then a write (and a quantization) per pool."""
        _check_rows(qkv, 3, "qkv")
        _check_tables(cos, sin_signed)
        tokens, rows, dim = qkv.shape
        if rows != heads + 2 * kv_heads:
            raise ValueError(f"qkv has {rows} heads, not {heads} + 2·{kv_heads}")
        if (k_scales is None) != (v_scales is None):
            raise ValueError("both pools are 8-bit or neither is")
        _check_pool(k_cache, k_scales, kv_heads, dim)
        _check_pool(v_cache, v_scales, kv_heads, dim)
        if qk_norms is not None:
            for weight in (qk_norms.q_weight, qk_norms.k_weight):
                if weight.shape != (dim,):
                    raise ValueError(f"a q/k norm's weight is {tuple(weight.shape)}, not ({dim},)")
        if tokens == 0:
            return
        norms = qk_norms or QKNorms(cos, cos, 0.0, True)  # unread without NORM
        _rope_write_kv_kernel[(tokens,)](
            qkv,
            cos,
            sin_signed,
            slots,
            k_cache,
            v_cache,
            _scale_bits(k_scales, k_cache),
            _scale_bits(v_scales, v_cache),
            norms.q_weight,
            norms.k_weight,
            norms.eps,
            qkv.stride(0),
            qkv.stride(1),
            cos.stride(0),
            sin_signed.stride(0),
            HEADS=heads,
            KV_HEADS=kv_heads,
            HALF=dim // 2,
            HEADS_BLOCK=triton.next_power_of_2(heads),
            KV_BLOCK=triton.next_power_of_2(kv_heads),
            DIM_BLOCK=triton.next_power_of_2(dim),
            QUANTIZE=k_scales is not None,
            NORM=qk_norms is not None,
            ROUND_NORMED=norms.round_normed,
        )

    def swiglu(self, gate_up: torch.Tensor) -> torch.Tensor:
        """gate_up: [T, 2·I] → silu(gate) · up [T, I], rounded as torch's two ops round."""
        return self._gated(gate_up, gelu=False)

    def geglu(self, gate_up: torch.Tensor) -> torch.Tensor:
        """gate_up: [T, 2·I] → gelu_tanh(gate) · up [T, I] (Gemma), rounded as torch's two
        ops round."""
        return self._gated(gate_up, gelu=True)

    def _gated(self, gate_up: torch.Tensor, *, gelu: bool) -> torch.Tensor:
        _check_rows(gate_up, 2, "gate_up")
        tokens, width = gate_up.shape
        inner = width // 2
        out = torch.empty((tokens, inner), dtype=gate_up.dtype, device=gate_up.device)
        if tokens == 0:
            return out
        block = min(1024, triton.next_power_of_2(inner))
        _gated_kernel[(tokens, triton.cdiv(inner, block))](
            gate_up, out, gate_up.stride(0), INNER=inner, BLOCK=block, GELU=gelu
        )
        return out


def _check_rows(x: torch.Tensor, dims: int, name: str) -> None:
    if x.dim() != dims or x.stride(-1) != 1:
        raise ValueError(f"{name} must be {dims}-d with contiguous rows, not {tuple(x.shape)}")


def _check_tables(cos: torch.Tensor, sin_signed: torch.Tensor) -> None:
    # [T, 1, D] as `Rope.tables` makes them: a row per token, read at its stride
    if cos.stride(-1) != 1 or sin_signed.stride(-1) != 1:
        raise ValueError("the rope tables' rows must be contiguous")


def _check_pool(cache: torch.Tensor, scales: torch.Tensor | None, kv_heads: int, dim: int) -> None:
    if cache.dim() != 4 or cache.shape[2:] != (kv_heads, dim) or not cache.is_contiguous():
        raise ValueError(f"a pool [blocks, block_tokens, {kv_heads}, {dim}], not {cache.shape}")
    if scales is None:
        return
    if cache.dtype != torch.int8 or scales.dtype != torch.bfloat16:
        raise ValueError("an 8-bit pool holds int8 values and bf16 scales")
    if scales.shape != cache.shape[:3] or not scales.is_contiguous():
        raise ValueError(f"scales {tuple(scales.shape)} do not match the pool {cache.shape}")


def _scale_bits(scales: torch.Tensor | None, cache: torch.Tensor) -> torch.Tensor:
    # bf16 scales as their int16 bits (see the module docstring); a plain pool passes its cache,
    # which the kernel never reads as scales.
    return cache if scales is None else scales.view(torch.int16)


def _warps(block: int) -> int:
    return 4 if block <= 1024 else 8
