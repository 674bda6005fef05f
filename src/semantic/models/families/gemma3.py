"""Gemma 3 (the text model; a multimodal checkpoint's language model too): four RMSNorms per
block, each `(1 + w)` and scaled in fp32 (around attention and around the MLP, the outputs
normalised before the residual add); RMSNorms of each head's q and k; queries scaled by
`query_pre_attn_scalar`; a GeGLU MLP (tanh GELU); embeddings times √hidden; tied LM head.
Sliding layers (five in six) read a window and rotate with their own rope base
(`rope_local_theta`, 10,000); global layers read everything, with `rope_theta` and its scaling.
Its chat turns (`<start_of_turn>`, `<end_of_turn>`) are the template of a file without one.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from semantic.models.families.family import (
    FULL_ATTENTION,
    SLIDING_ATTENTION,
    BlockShape,
    BuiltinTemplate,
    ConfigRules,
    Family,
    GGUFMetadata,
    GGUFRules,
    ModelShape,
    full_every,
)

_TEXT_PREFIXES = ("model.language_model.", "language_model.model.")  # multimodal checkpoints
_VISION_PREFIXES = (
    "vision_tower.",
    "multi_modal_projector.",
    "model.vision_tower.",
    "model.multi_modal_projector.",
)


def text_name(name: str) -> str | None:
    """A multimodal checkpoint's language-model names as the text model's; its vision tower
    and projector skipped."""
    for prefix in _TEXT_PREFIXES:
        if name.startswith(prefix):
            return "model." + name.removeprefix(prefix)
    if name.startswith(_VISION_PREFIXES):
        return None
    return name.removeprefix("language_model.")  # language_model.lm_head.weight


def text_weights(
    arrays: Iterable[tuple[str, Any]], config: ModelShape
) -> Iterator[tuple[str, Any]]:
    for name, array in arrays:
        renamed = text_name(name)
        if renamed is not None:
            yield renamed, array


def five_sliding_then_global(config: dict[str, Any], layer: int) -> str:
    pattern = config.get("sliding_window_pattern") or config.get("_sliding_window_pattern", 6)
    return FULL_ATTENTION if (layer + 1) % pattern == 0 else SLIDING_ATTENTION


def gguf_fields(gguf: GGUFMetadata, fields: dict[str, Any]) -> dict[str, Any]:
    """What llama.cpp fixes for Gemma 3: its activation, queries scaled by key_length^-0.5 (the
    27B's n_embd / n_head aside), the local rope base; chat turns end with <end_of_turn>, which
    llama.cpp also stops at."""
    tokens: list[str] = gguf.metadata.get("tokenizer.ggml.tokens", [])
    end_of_turn = [i for i, token in enumerate(tokens) if token == "<end_of_turn>"][:1]
    return {
        "hidden_act": "gelu_pytorch_tanh",
        "query_pre_attn_scalar": float(fields["head_dim"]),
        "rope_local_theta": 10000.0,
        "eos_token_ids": tuple(dict.fromkeys([*fields["eos_token_ids"], *end_of_turn])),
    }


# Gemma 3's own template (google/gemma-3-*-it): the system prompt opens the first user turn,
# roles must alternate, the assistant is "model", every turn ends with <end_of_turn>.
TEMPLATE = """{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- if messages[0]['content'] is string -%}
        {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}
    {%- else -%}
        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}
    {%- endif -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- elif message['content'] is iterable -%}
        {%- for item in message['content'] -%}
            {%- if item['type'] == 'image' -%}
                {{ '<start_of_image>' }}
            {%- elif item['type'] == 'text' -%}
                {{ item['text'] | trim }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{ raise_exception("Invalid content type") }}
    {%- endif -%}
    {{ '<end_of_turn>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model\n'}}
{%- endif -%}
"""


FAMILY = Family(
    model_types=("gemma3",),
    aliases=("gemma3_text",),
    block=BlockShape(skeleton="gemma3"),
    config=ConfigRules(tied_embeddings=True, layer_type=five_sliding_then_global),
    gguf=GGUFRules(
        architectures=("gemma3",),
        tensor_names={
            "post_attention_norm": "post_attention_layernorm",
            "ffn_norm": "pre_feedforward_layernorm",
            "post_ffw_norm": "post_feedforward_layernorm",
        },
        norm_plus_one=True,
        layer_types=full_every(6),
        fields=gguf_fields,
    ),
    weight_names=text_weights,
    chat_template=BuiltinTemplate("gemma", TEMPLATE),
)
