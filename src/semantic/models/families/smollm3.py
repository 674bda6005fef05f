"""SmolLM3: Llama's blocks (grouped-query attention, SwiGLU, tied embeddings by default, rope
base 2,000,000 by default, biases where `attention_bias` says) in which some layers apply no
rotary embedding at all ("NoPE"): `no_rope_layers[i] == 0`, by default every fourth layer.
Where `use_sliding_window` is set, the rope-less layers slide. Its chat template lists tools
as `xml_tools` (`text/chat.py`); `<think>` blocks are plain text to the model."""

from __future__ import annotations

from typing import Any

from semantic.models.families.family import (
    FULL_ATTENTION,
    SLIDING_ATTENTION,
    ConfigRules,
    Family,
    GGUFMetadata,
    GGUFRules,
)


def no_rope_every(interval: int, layers: int) -> tuple[int, ...]:
    """`no_rope_layers` with every `interval`-th layer (counting from 1) rope-less."""
    return tuple(int((i + 1) % interval != 0) for i in range(layers))


def no_rope_layers(config: dict[str, Any], layers: int) -> tuple[int, ...]:
    """Its list, or, in configs without one, every `no_rope_layer_interval`-th layer (default
    4) without rope."""
    listed = config.get("no_rope_layers")
    if listed is not None:
        return tuple(int(bool(flag)) for flag in listed)
    interval = config.get("no_rope_layer_interval") or 4
    return no_rope_every(interval, layers)


def window_in_rope_less_layers(config: dict[str, Any], layer: int) -> str:
    """A window only when asked for, then in the layers without rope."""
    flags = no_rope_layers(config, layer + 1)
    nope = layer < len(flags) and not flags[layer]
    return SLIDING_ATTENTION if config.get("use_sliding_window") and nope else FULL_ATTENTION


def gguf_fields(gguf: GGUFMetadata, fields: dict[str, Any]) -> dict[str, Any]:
    """The file has no key for the NoPE layers: llama.cpp fixes its step at 4 (every 4th layer
    without rope, `n_no_rope_layer_step`), as the released configs' list says. Bounded by the
    tensor table: a hostile block_count fails the load."""
    layers = min(gguf.arch("block_count"), len(gguf.tensor_names))
    return {"no_rope_layers": no_rope_every(4, layers)}


FAMILY = Family(
    model_types=("smollm3",),
    config=ConfigRules(
        tied_embeddings=True,
        rope_theta=2_000_000.0,
        layer_type=window_in_rope_less_layers,
        no_rope_layers=no_rope_layers,
    ),
    # llama.cpp's converter permutes its Q/K rows as Llama's (its class inherits LlamaModel's).
    gguf=GGUFRules(
        architectures=("smollm3",), q_k_permuted=True, blocks_kept=True, fields=gguf_fields
    ),
)
