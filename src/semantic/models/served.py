"""The model the engine is serving, as the API layer sees it: its name, tokenizer and template."""

from __future__ import annotations

from dataclasses import dataclass

from semantic.models.config import ModelConfig
from semantic.text.chat import ChatTemplate
from semantic.text.tokenizer import Tokenizer


@dataclass(slots=True, frozen=True)
class ServedModel:
    """Everything about the loaded model that is not compute. `context_length` is the model's
    context, capped by the `max_model_len` setting."""

    name: str
    config: ModelConfig
    tokenizer: Tokenizer
    chat_template: ChatTemplate
    context_length: int
