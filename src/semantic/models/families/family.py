"""The record of one model family: everything that makes it that family, in one place, for the
config readers (`models/config.py`, `models/gguf.py`), the chat template's fallback and both
backends' builders. A family's own file fills one `Family`; `families/__init__.py` lists them.
Records read raw configs and describe `ModelConfig` fields by name; they never import it, so
the config reads the families and not the other way round."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

# A layer's attention, as Hugging Face's `layer_types` names it.
FULL_ATTENTION = "full_attention"
SLIDING_ATTENTION = "sliding_attention"


class ModelShape(Protocol):
    """What a family's weight fix-ups read of the model's config (`ModelConfig` has it)."""

    @property
    def num_attention_heads(self) -> int: ...
    @property
    def num_key_value_heads(self) -> int: ...
    @property
    def head_dim(self) -> int: ...
    def extra(self, name: str, default: Any) -> Any: ...


# Checkpoint tensors (numpy arrays; on the torch backend also Q4_K blocks or a prepared load's
# shape-only tensors) renamed, split or fixed up into the names and layout the blocks read.
WeightNames = Callable[[Iterable[tuple[str, Any]], ModelShape], Iterator[tuple[str, Any]]]


def as_named(arrays: Iterable[tuple[str, Any]], config: ModelShape) -> Iterator[tuple[str, Any]]:
    """The checkpoint's names are the blocks' names already."""
    return iter(arrays)


def every_layer_slides(config: dict[str, Any], layer: int) -> str:
    """Mistral's rule: a window in every layer when the config sets one."""
    return SLIDING_ATTENTION


def no_fields(config: dict[str, Any]) -> dict[str, Any]:
    return {}


@dataclass(slots=True, frozen=True)
class ConfigRules:
    """How a family's `config.json` reads where it is silent or speaks its own way.

    `layer_type` derives a layer's attention in configs written before `layer_types` existed
    (called only when the config sets a `sliding_window`). `no_rope_layers`, where the family
    has rope-less layers, lists each layer's rope flag (1 rope, 0 none). `fields` reads what
    only this family has, as `ModelConfig` fields that replace the common reading (its own
    numbers go in `extras`)."""

    tied_embeddings: bool = False  # `tie_word_embeddings` when the config leaves it out
    rope_theta: float = 10000.0  # the rope base when left out (transformers' default_theta)
    attention_bias: bool = False  # `attention_bias` when left out (Qwen2's config has no flag)
    yarn_is_longrope: bool = False  # Phi-3's older configs name LongRoPE `yarn`
    layer_type: Callable[[dict[str, Any], int], str] = every_layer_slides
    no_rope_layers: Callable[[dict[str, Any], int], tuple[int, ...]] | None = None
    fields: Callable[[dict[str, Any]], dict[str, Any]] = no_fields


class GGUFMetadata(Protocol):
    """What a family's GGUF rules read of an opened file (`models/gguf.py: GGUFFile`)."""

    metadata: dict[str, Any]

    @property
    def tensor_names(self) -> frozenset[str]: ...

    def arch(self, key: str, default: Any = ...) -> Any: ...


def no_gguf_fields(gguf: GGUFMetadata, fields: dict[str, Any]) -> dict[str, Any]:
    return {}


def no_sliding_layers(layers: int) -> tuple[str, ...]:
    return ()


def full_every(n: int) -> Callable[[int], tuple[str, ...]]:
    """llama.cpp's `set_swa_pattern(n)`: every n-th layer full attention, the rest sliding."""

    def layer_types(layers: int) -> tuple[str, ...]:
        return tuple(SLIDING_ATTENTION if i % n < n - 1 else FULL_ATTENTION for i in range(layers))

    return layer_types


def all_sliding(layers: int) -> tuple[str, ...]:
    return (SLIDING_ATTENTION,) * layers


# A MoE layer's experts stacked per projection in a GGUF, each [E, out, in].
GGUF_EXPERT_TENSORS = {
    "ffn_gate_exps": "mlp.experts.gate_proj",
    "ffn_up_exps": "mlp.experts.up_proj",
    "ffn_down_exps": "mlp.experts.down_proj",
}


def gguf_expert_counts(gguf: GGUFMetadata) -> dict[str, Any]:
    return {
        "num_local_experts": gguf.arch("expert_count"),
        "num_experts_per_tok": gguf.arch("expert_used_count"),
    }


@dataclass(slots=True, frozen=True)
class GGUFRules:
    """How llama.cpp's converter wrote the family, and what llama.cpp assumes for it instead of
    writing it into the file; `models/gguf.py` undoes and completes it."""

    architectures: tuple[str, ...]  # `general.architecture` values of this family
    # llama.cpp's tensor names where they differ from the common ones (its tensor_mapping).
    tensor_names: Mapping[str, str] = field(default_factory=dict)
    q_k_permuted: bool = False  # Q/K rows interleaved per head (LlamaModel.modify_tensors)
    norm_plus_one: bool = False  # RMSNorm weights stored as 1 + w (Gemma's norm)
    # Q4_K matrices kept as blocks: every linear is taken whole by the backends (no fused
    # tensor split, no head dims reordered as arrays, no 1 + w folded).
    blocks_kept: bool = False
    # The layers' attention where the file sets a sliding window.
    layer_types: Callable[[int], tuple[str, ...]] = no_sliding_layers
    # `rope.dimension_count` may stand for the head's size (not where it counts the rotated
    # dims only, Phi-4-mini's 3/4).
    head_dim_from_rope: bool = True
    # What the family's fields are beyond (or instead of) the common reading, which it is given.
    fields: Callable[[GGUFMetadata, dict[str, Any]], dict[str, Any]] = no_gguf_fields


@dataclass(slots=True, frozen=True)
class BlockShape:
    """The decoder block both backends build for the family. `skeleton` names the builder:
    "llama" (pre-norm attention and a gated MLP, which the options below vary), "gemma3"
    (four `1 + w` norms a block, q/k norms, GeGLU, its own local rope) or "gpt_oss" (sinks,
    biases, clamped SwiGLU experts)."""

    skeleton: Literal["llama", "gemma3", "gpt_oss"] = "llama"
    qkv_bias: bool | None = None  # None: as the config's `attention_bias` says
    o_bias: bool | None = None
    qk_norms: bool = False  # an RMSNorm over each head's q and k, before rope
    # Qwen3 MoE's: a softmax router's top k experts in the sparse layers
    # (`ModelConfig.layer_has_experts`), a dense MLP in the rest.
    experts: bool = False


@dataclass(slots=True, frozen=True)
class BuiltinTemplate:
    """A chat template for files that carry none, and the name it is reported by."""

    name: str
    source: str


@dataclass(slots=True, frozen=True)
class Family:
    """One model family. `model_types` are the Hugging Face `model_type`s it reads as itself
    (the first is its own); `aliases` are read as the first (a multimodal checkpoint's text
    model). `weight_names` turns a checkpoint's tensors (Hugging Face's, or a GGUF's once
    `models/gguf.py` named them) into those the block reads. `chat_template` is the template
    for a file without one (None: ChatML); tool calls are parsed as the template writes them
    (`text/tool_formats.py: parser_for`), so no family names a tool format of its own."""

    model_types: tuple[str, ...]
    block: BlockShape = BlockShape()
    config: ConfigRules = ConfigRules()
    gguf: GGUFRules | None = None
    weight_names: WeightNames = as_named
    aliases: tuple[str, ...] = ()
    chat_template: BuiltinTemplate | None = None

    @property
    def name(self) -> str:
        return self.model_types[0]
