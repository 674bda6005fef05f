"""IBM Granite 3 (`granite`: granite-3.x-2b/8b, dense): Llama's blocks scaled by four numbers
of its config: embeddings times `embedding_multiplier`, each block's attention and MLP output
times `residual_multiplier` before the residual add, q·k times `attention_multiplier` (not
head_dim^-0.5), logits divided by `logits_scaling`. Each is linear in one weight, so it is
folded into that weight at load and the model runs on the Llama skeleton unchanged: q_proj
(and its bias) by attention_multiplier·√head_dim, o_proj and down_proj by
residual_multiplier, the embedding table by embedding_multiplier and the LM head by
1/logits_scaling. The embeddings and the head scale differently, so a tied checkpoint is
served untied (its table twice). No GGUF: llama.cpp's `granite` files are not read yet."""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from typing import Any

from semantic.errors import ModelLoadFailed
from semantic.models.families.family import ConfigRules, Family, ModelShape

_MULTIPLIERS = (
    "embedding_multiplier",
    "residual_multiplier",
    "attention_multiplier",
    "logits_scaling",
)


def read_multipliers(config: dict[str, Any]) -> dict[str, Any]:
    """Its four numbers (1.0 where left out, as transformers' defaults), and the head untied."""
    if config.get("mlp_bias"):
        raise ModelLoadFailed("Granite's MLP biases (mlp_bias) are not supported")
    extras = tuple((name, float(config.get(name, 1.0))) for name in _MULTIPLIERS)
    return {"tie_word_embeddings": False, "extras": extras}


def folded_multipliers(
    arrays: Iterable[tuple[str, Any]], config: ModelShape
) -> Iterator[tuple[str, Any]]:
    """Each multiplier folded into the weight it scales (new arrays: a checkpoint's may be
    read-only or shared); the head made from the embedding table where the checkpoint has
    none (tied)."""
    residual = config.extra("residual_multiplier", 1.0)
    scales = {
        "self_attn.q_proj": config.extra("attention_multiplier", 1.0) * math.sqrt(config.head_dim),
        "self_attn.o_proj": residual,
        "mlp.down_proj": residual,
    }
    logits_scaling = config.extra("logits_scaling", 1.0)
    table, head_seen = None, False
    for name, array in arrays:
        module = name.rpartition(".")[0].partition(".layers.")[2].partition(".")[2]
        if name == "model.embed_tokens.weight":
            table = array
            yield name, array * config.extra("embedding_multiplier", 1.0)
        elif name == "lm_head.weight":
            head_seen = True
            yield name, array / logits_scaling
        elif module in scales:
            yield name, array * scales[module]
        else:
            yield name, array
    if not head_seen and table is not None:
        yield "lm_head.weight", table / logits_scaling


FAMILY = Family(
    model_types=("granite",),
    config=ConfigRules(fields=read_multipliers),
    weight_names=folded_multipliers,
)
