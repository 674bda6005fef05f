"""The layers every family's model is built from, on the torch backend over the paged KV pool:
RMSNorm, rotary embeddings, attention, the gated MLP, the decoder block and the decoder itself.

Tokens are flattened across the batch (`[T, ...]`, varlen). Modules are plain classes, not
`nn.Module`: a decode step makes ~30 calls per layer and the module call machinery would add
measurable CPU time to each. Each family file (`llama.py`, `gemma3.py`, …) only says which of
these it uses, with which options, and where its weights are.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple, Protocol, runtime_checkable

import torch
import torch.nn.functional as F

from semantic.backends.torch.attention import (
    AttentionMetadata,
    LayerAttention,
    LayerKV,
    paged_attention,
)
from semantic.backends.torch.blocks import BlockFactory
from semantic.backends.torch.linear import Linear, LinearFactory
from semantic.backends.torch.models.rope import Rope, apply_rope
from semantic.errors import ModelLoadFailed
from semantic.models.config import ModelConfig

Activation = Callable[[torch.Tensor], torch.Tensor]


class LayerKernels(Protocol):
    """A layer's small ops in one pass each: ours on the CPU (`kernels/`, `CpuKernels`, in bf16
    and fp32) and Triton's on CUDA (`cuda/layers.py`). Each computes what the stock torch ops
    beside its call compute."""

    def rms_norm(
        self, x: torch.Tensor, weight: torch.Tensor, eps: float, round_normed: bool = True
    ) -> torch.Tensor: ...

    def add_rms_norm(
        self,
        x: torch.Tensor,
        delta: torch.Tensor,
        weight: torch.Tensor,
        eps: float,
        round_normed: bool = True,
    ) -> torch.Tensor: ...

    def rope(
        self, x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor
    ) -> torch.Tensor: ...

    def swiglu(self, gate_up: torch.Tensor) -> torch.Tensor: ...


class QKNorms(NamedTuple):
    """RMSNorms of each q and k head before rope (Qwen3, Gemma 3), as a `RopeWriter` applies
    them: their weights [D], eps, and whether the normalised row is rounded to the dtype before
    it is scaled (`RMSNorm`)."""

    q_weight: torch.Tensor
    k_weight: torch.Tensor
    eps: float
    round_normed: bool


@runtime_checkable
class RopeWriter(Protocol):
    """Kernels that norm (where the family does) and rope a step's q and k in place in the fused
    QKV projection's output and write its K/V into the pool, in one pass (`cuda/layers.py`)."""

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
    ) -> None: ...


@runtime_checkable
class GegluKernels(Protocol):
    """Kernels with GeGLU's middle in one pass (`cuda/layers.py`)."""

    def geglu(self, gate_up: torch.Tensor) -> torch.Tensor: ...


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")


# Named functions, not lambdas: a built model is pickled into its prepared file (prepared.py).
_ACTIVATIONS: dict[str, Activation] = {
    "silu": F.silu,
    "gelu_pytorch_tanh": gelu_tanh,
    "gelu": F.gelu,
}


def activation(name: str) -> Activation:
    try:
        return _ACTIVATIONS[name]
    except KeyError:
        raise ModelLoadFailed(f"activation {name!r} is not supported") from None


@dataclass(slots=True, frozen=True)
class Build:
    """What every family's builder needs besides the weights: the config, where the tensors go,
    how each linear stores its weight (`linear.py`) and the layers' kernels (None: stock
    torch)."""

    config: ModelConfig
    dtype: torch.dtype
    device: torch.device
    linear: LinearFactory
    kernels: LayerKernels | None
    weight_format: str = "bf16"  # how `linear` stores a weight: "bf16" (the dtype) or "int8"
    blocks: BlockFactory | None = None  # a GGUF's Q4_K matrices on our kernels (`blocks.py`)

    def tensor(self, array: torch.Tensor) -> torch.Tensor:
        """A loaded fp32 tensor in the model's dtype on its device."""
        return array.to(device=self.device, dtype=self.dtype).contiguous()


@dataclass(slots=True, frozen=True)
class StepContext:
    """What every layer reads in a step: the attention metadata and each rope's cos and
    signed sin for the step's positions (computed once, shared by the layers)."""

    meta: AttentionMetadata
    rope_tables: dict[Rope, tuple[torch.Tensor, torch.Tensor]]

    @classmethod
    def build(
        cls,
        ropes: list[Rope],
        positions: torch.Tensor,
        dtype: torch.dtype,
        meta: AttentionMetadata,
    ) -> StepContext:
        return cls(meta, {rope: rope.tables(positions, dtype) for rope in ropes})


class RMSNorm:
    """Like Hugging Face: normalise in fp32, round to the model dtype, then scale (Llama,
    Qwen); or scale in fp32 and round once (`scale_in_fp32`: Gemma, GPT-OSS). Gemma's `1 + w`
    is folded into the weight at load (`weights.norm_from`). Our CPU kernel does it in one
    call (~2 µs at decode sizes; stock torch takes ~8 ops, ~30 µs)."""

    __slots__ = ("eps", "kernels", "scale_in_fp32", "weight")

    def __init__(
        self,
        weight: torch.Tensor,
        eps: float,
        kernels: LayerKernels | None,
        *,
        scale_in_fp32: bool = False,
    ) -> None:
        self.weight = weight
        self.eps = eps
        self.kernels = kernels
        self.scale_in_fp32 = scale_in_fp32

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        # x: [..., D], rows contiguous
        if x.dim() != 2:
            return self(x.reshape(-1, x.shape[-1])).view(x.shape)
        if self.kernels is not None:
            return self.kernels.rms_norm(x, self.weight, self.eps, not self.scale_in_fp32)
        normed = F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps)
        if self.scale_in_fp32:
            return (normed * self.weight.float()).to(x.dtype)
        return self.weight * normed.to(x.dtype)

    def add(self, x: torch.Tensor, delta: torch.Tensor | None) -> torch.Tensor:
        """`x += delta` (the residual stream, in place), then the norm of x: one pass where
        the kernels fuse them. x, delta: [T, D]; no delta: the norm alone."""
        if delta is None:
            return self(x)
        if self.kernels is not None:
            return self.kernels.add_rms_norm(
                x, delta, self.weight, self.eps, not self.scale_in_fp32
            )
        x += delta
        return self(x)


class Attention:
    """Grouped-query attention over the pool: fused QKV projection (with its bias, if any),
    optional RMSNorms of each head's q and k (Qwen3, Gemma 3), rope on q and k together (our
    kernel in bf16 where there is one; none where `rope` is None, a NoPE layer of SmolLM3),
    paged attention as the layer's `LayerAttention` says (scale, sliding window, sinks), output
    projection. Kernels that can (`RopeWriter`, on CUDA) norm and rope q and k and write K/V
    into the pool in one pass; a NoPE layer has nothing to rope, and attention writes its
    K/V."""

    def __init__(
        self,
        config: ModelConfig,
        qkv: Linear,
        o: Linear,
        rope: Rope | None,
        how: LayerAttention,
        kernels: LayerKernels | None,
        qk_norms: tuple[RMSNorm, RMSNorm] | None = None,
    ) -> None:
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.qkv = qkv
        self.o = o
        self.rope = rope
        self.how = how
        self.qk_norms = qk_norms
        self.kernels = kernels if config.head_dim % 32 == 0 else None
        self.rope_writer = kernels if isinstance(kernels, RopeWriter) else None
        self.fused_norms = None if qk_norms is None else fused_norms(*qk_norms)

    def __call__(self, x: torch.Tensor, step: StepContext, kv: LayerKV) -> torch.Tensor:
        # x: [T, D_model]
        tokens = x.shape[0]
        heads, kv_heads, dim = self.heads, self.kv_heads, self.head_dim
        qkv = self.qkv(x).view(tokens, heads + 2 * kv_heads, dim)  # [T, H + 2·KVH, D]
        if self.rope_writer is not None and self.rope is not None:
            cos, sin_signed = step.rope_tables[self.rope]
            slots = step.meta.groups[kv.group].slot_mapping
            self.rope_writer.rope_write_kv(
                qkv,
                heads,
                kv_heads,
                cos,
                sin_signed,
                slots,
                kv.k,
                kv.v,
                kv.k_scales,
                kv.v_scales,
                self.fused_norms,
            )
            q, k, v = qkv.split((heads, kv_heads, kv_heads), 1)
            out = paged_attention(q, k, v, kv, step.meta, self.how, written=True)
            return self.o(out.reshape(tokens, heads * dim))
        qk = qkv[:, : heads + kv_heads]
        if self.qk_norms is not None:
            q_norm, k_norm = self.qk_norms
            qk = torch.cat([q_norm(qk[:, :heads]), k_norm(qk[:, heads:])], 1)
        if self.rope is not None:
            qk = self._rope(qk, *step.rope_tables[self.rope])  # [T, H + KVH, D]
        q, k, v = qk[:, :heads], qk[:, heads:], qkv[:, heads + kv_heads :]
        out = paged_attention(q, k, v, kv, step.meta, self.how)  # [T, H, D]
        return self.o(out.reshape(tokens, heads * dim))

    def _rope(self, qk: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor) -> torch.Tensor:
        if self.kernels is not None and qk.dtype == torch.bfloat16:
            return self.kernels.rope(qk, cos, sin_signed)
        return apply_rope(qk, cos, sin_signed)


def fused_norms(q_norm: RMSNorm, k_norm: RMSNorm) -> QKNorms:
    """A layer's q and k norms as a `RopeWriter` takes them: one eps and rounding for both."""
    if (q_norm.eps, q_norm.scale_in_fp32) != (k_norm.eps, k_norm.scale_in_fp32):
        raise ModelLoadFailed("a layer's q and k norms differ in eps or rounding")
    return QKNorms(q_norm.weight, k_norm.weight, q_norm.eps, not q_norm.scale_in_fp32)


class GatedMLP:
    """down(act(gate(x)) · up(x)), the gate and up projections fused into one matmul: SwiGLU
    with SiLU (Llama, Qwen; its middle in one pass of our kernel in bf16 where there is one),
    GeGLU with tanh-GELU (Gemma; its middle in one pass where the kernels have it: Triton's,
    in any dtype)."""

    def __init__(
        self, gate_up: Linear, down: Linear, act: Activation, kernels: LayerKernels | None
    ) -> None:
        self.gate_up = gate_up
        self.down = down
        self.act = act
        self.swiglu = kernels if act is F.silu else None
        self.geglu = kernels if act is gelu_tanh and isinstance(kernels, GegluKernels) else None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        # x: [T, D_model]
        gate_up = self.gate_up(x)  # [T, 2·I]
        if self.swiglu is not None and gate_up.dtype == torch.bfloat16:
            return self.down(self.swiglu.swiglu(gate_up))
        if self.geglu is not None:
            return self.down(self.geglu.geglu(gate_up))
        gate, up = gate_up.chunk(2, dim=-1)  # [T, I] each
        return self.down(self.act(gate) * up)


FeedForward = Callable[[torch.Tensor], torch.Tensor]


class Block:
    """A pre-norm decoder block; Gemma's also normalises each sublayer's output
    (`post_attn_norm`, `post_mlp_norm`) before adding it to the residual stream."""

    def __init__(
        self,
        attn: Attention,
        mlp: FeedForward,
        attn_norm: RMSNorm,
        mlp_norm: RMSNorm,
        post_attn_norm: RMSNorm | None = None,
        post_mlp_norm: RMSNorm | None = None,
    ) -> None:
        self.attn = attn
        self.mlp = mlp
        self.attn_norm = attn_norm
        self.mlp_norm = mlp_norm
        self.post_attn_norm = post_attn_norm
        self.post_mlp_norm = post_mlp_norm

    def __call__(
        self, x: torch.Tensor, step: StepContext, kv: LayerKV, delta: torch.Tensor | None
    ) -> torch.Tensor:
        """x: [T, D_model], the residual stream (this step's own tensor), to which the previous
        block's output `delta` (None before the first) is added here, in place, in one pass with
        this block's first norm; returns this block's output, for the next block to add."""
        h = self.attn(self.attn_norm.add(x, delta), step, kv)
        h = self.mlp(self.mlp_norm.add(x, _post_norm(self.post_attn_norm, h)))
        return _post_norm(self.post_mlp_norm, h)


def _post_norm(norm: RMSNorm | None, h: torch.Tensor) -> torch.Tensor:
    return h if norm is None else norm(h)


class DecoderModel:
    """Embeddings, blocks and the LM head, bound to no KV storage: the caller passes each
    layer's `LayerKV` and the step's metadata. `embed_scale` multiplies the embeddings
    (Gemma: √hidden, rounded to the model dtype as Hugging Face rounds it)."""

    def __init__(
        self,
        config: ModelConfig,
        embed: Linear,
        blocks: list[Block],
        norm: RMSNorm,
        lm_head: Linear,
        embed_scale: float | None = None,
    ) -> None:
        self.config = config
        self.embed = embed  # its rows [V, D_model] are the embeddings
        self.blocks = blocks
        self.norm = norm
        self.lm_head = lm_head
        self.embed_scale = embed_scale
        ropes = (block.attn.rope for block in blocks)
        self.ropes = list(dict.fromkeys(rope for rope in ropes if rope is not None))

    @property
    def layer_windows(self) -> tuple[int | None, ...]:
        """Each layer's sliding window (None: full attention), for the cache spec."""
        return tuple(block.attn.how.window for block in self.blocks)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_layers: list[LayerKV],
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        # input_ids, positions: [T] → hidden: [T, D_model]
        x = self.embed.rows(input_ids)
        if self.embed_scale is not None:
            x = x * self.embed_scale
        step = StepContext.build(self.ropes, positions, x.dtype, meta)
        delta = None
        for block, kv in zip(self.blocks, kv_layers, strict=True):
            delta = block(x, step, kv, delta)
        if delta is not None:
            x += delta
        return x

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        # hidden: [N, D_model] → [N, V] fp32
        return self.lm_head(self.norm(hidden)).float()
