"""The chat templates a model gets when its file has none (a GGUF converted without one), by
family, as llama.cpp falls back to a built-in template: Gemma's turns for Gemma, ChatML (Qwen's
format, transformers' historical default) for the rest."""

from __future__ import annotations

from dataclasses import dataclass

from semantic.text.chat import CHATML_TEMPLATE

# Gemma 3's own template (google/gemma-3-*-it): the system prompt opens the first user turn,
# roles must alternate, the assistant is "model", every turn ends with <end_of_turn>.
GEMMA_TEMPLATE = """{{ bos_token }}
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


@dataclass(slots=True, frozen=True)
class BuiltinTemplate:
    name: str
    source: str


_BY_FAMILY = {"gemma3": BuiltinTemplate("gemma", GEMMA_TEMPLATE)}
_DEFAULT = BuiltinTemplate("chatml", CHATML_TEMPLATE)


def builtin_template(model_type: str) -> BuiltinTemplate:
    """The template for a model of this family whose file carries none."""
    return _BY_FAMILY.get(model_type, _DEFAULT)
