"""The model families, one file each, found by a checkpoint's `model_type` or a GGUF's
architecture. Each file exports one `Family` record (`family.py`): its config rules, GGUF
rules, weight-name fix-ups, fallback chat template and block shape. Adding a family is a file
here and its line below; `docs/models.md` says how."""

from __future__ import annotations

from semantic.models.families import (
    gemma3,
    gpt_oss,
    granite,
    llama,
    phi3,
    qwen2,
    qwen3,
    qwen3_moe,
    smollm3,
)
from semantic.models.families.family import Family

FAMILIES: tuple[Family, ...] = (
    llama.FAMILY,
    qwen2.FAMILY,
    qwen3.FAMILY,
    qwen3_moe.FAMILY,
    gemma3.FAMILY,
    gpt_oss.FAMILY,
    phi3.FAMILY,
    smollm3.FAMILY,
    granite.FAMILY,
)

_BY_MODEL_TYPE = {t: f for f in FAMILIES for t in (*f.model_types, *f.aliases)}
_BY_GGUF_ARCHITECTURE = {a: f for f in FAMILIES if f.gguf for a in f.gguf.architectures}


def family_of(model_type: str) -> Family | None:
    """The family a Hugging Face `model_type` belongs to; None for one we do not know."""
    return _BY_MODEL_TYPE.get(model_type)


def family_of_gguf(architecture: str) -> Family | None:
    """The family of a GGUF's `general.architecture`; None for one we cannot read."""
    return _BY_GGUF_ARCHITECTURE.get(architecture)


def supported_model_types() -> list[str]:
    return sorted(t for f in FAMILIES for t in f.model_types)


def supported_gguf_architectures() -> list[str]:
    return sorted(_BY_GGUF_ARCHITECTURE)
