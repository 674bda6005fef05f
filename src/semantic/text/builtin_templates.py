"""The chat template a model gets when its file has none (a GGUF converted without one), as
llama.cpp falls back to a built-in template: its family's own where the family's record names
one (Gemma's turns for Gemma), else ChatML (Qwen's format, transformers' historical default)."""

from __future__ import annotations

from semantic.models.families import family_of
from semantic.models.families.family import BuiltinTemplate
from semantic.text.chat import CHATML_TEMPLATE

__all__ = ["BuiltinTemplate", "builtin_template"]

_DEFAULT = BuiltinTemplate("chatml", CHATML_TEMPLATE)


def builtin_template(model_type: str) -> BuiltinTemplate:
    """The template for a model of this family whose file carries none."""
    family = family_of(model_type)
    if family is None or family.chat_template is None:
        return _DEFAULT
    return family.chat_template
