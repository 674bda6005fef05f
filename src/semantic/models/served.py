"""The model the engine is serving, as the API layer sees it: its name, tokenizer and template."""

from __future__ import annotations

from dataclasses import dataclass, field

from semantic.core import PROTOCOL_SAMPLING, DefaultSampling, ToolArguments
from semantic.errors import ModelNotFound
from semantic.models.config import ModelConfig
from semantic.text.chat import ChatTemplate
from semantic.text.grammar import GrammarCompiler
from semantic.text.tokenizer import Tokenizer


@dataclass(slots=True, frozen=True)
class ServedModel:
    """Everything about the loaded model that is not compute. `context_length` is the model's
    context, capped by the `max_model_len` setting; `weights_fingerprint` names its weights
    (their KV cache is tagged with it); `aliases` are the other names it answers to (the
    registry's names for it, when `name` is the served model name); `sampling` is what a
    request that leaves temperature, top_p or top_k out gets; `grammars` compiles the
    structured-output grammars of requests over its vocabulary; `tool_arguments` what its
    tool calls may hold (api/tool_use.py)."""

    name: str
    config: ModelConfig
    tokenizer: Tokenizer
    chat_template: ChatTemplate
    context_length: int
    weights_fingerprint: str
    aliases: tuple[str, ...] = ()
    sampling: DefaultSampling = PROTOCOL_SAMPLING
    tool_arguments: ToolArguments = "all"
    grammars: GrammarCompiler = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "grammars", GrammarCompiler(self.tokenizer, self.config.vocab_size)
        )

    def check_requested_name(self, requested: str, strict: bool) -> None:
        """Raise `ModelNotFound` unless this model may answer a request for `requested` (every
        API asks here). Any name may when matching is not `strict`: clients with fixed names
        (`claude-*`, `gpt-*`) get the loaded model. Strict, only this model's own names may, in
        any case, as the registry matches them."""
        names = list(dict.fromkeys((self.name, *self.aliases)))
        if not strict or requested.lower() in {name.lower() for name in names}:
            return
        raise ModelNotFound(
            f"The model {requested[:200]!r} does not exist on this server; "
            f"available: {', '.join(names)}"
        )
