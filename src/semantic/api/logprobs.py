"""Log probabilities in every API that has them: how many alternatives a request may ask for,
the reply's tokens' log probabilities as its events bring them (`Trail`), and their JSON in
the two shapes the OpenAI APIs use: Chat Completions' and Responses' entries (`entries`), and
legacy Completions' parallel lists (`legacy_json`).

A token is shown as OpenAI shows it: `token` its text, `bytes` the UTF-8 bytes it stands for
(a byte-level token may hold part of a character: its `token` is then `bytes:\\xe2\\x80`).
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, TypeVar

from semantic.core import TokenEvent, TokenLogprob
from semantic.engine.port import EnginePort
from semantic.errors import InvalidRequest
from semantic.text.tokenizer import Tokenizer

# The most alternatives a token may carry: OpenAI's bounds for `top_logprobs` (Chat
# Completions, Responses) and for legacy Completions' `logprobs`.
MAX_TOP_LOGPROBS = 20
MAX_LEGACY_LOGPROBS = 5
# What a log probability of minus infinity (a token the model rules out) is shown as: JSON has
# no infinity, and OpenAI shows this.
LOWEST_LOGPROB = -9999.0

T = TypeVar("T")


def chat_logprobs(logprobs: bool, top_logprobs: int | None) -> int | None:
    """What a Chat Completions request asks of the sampler (`SamplingParams.logprobs`):
    `top_logprobs` alternatives, when `logprobs` is on; a 400 for `top_logprobs` without it."""
    if top_logprobs is not None and not logprobs:
        raise InvalidRequest(
            "top_logprobs: only allowed when logprobs is true", param="top_logprobs"
        )
    return (top_logprobs or 0) if logprobs else None


def requires_logprobs(field: str) -> dict[str, Any]:
    """The JSON schema of "`field`, when set, needs `logprobs: true`" (`chat_logprobs`)."""
    return {
        "if": {"properties": {field: {"type": "integer"}}, "required": [field]},
        "then": {"properties": {"logprobs": {"const": True}}, "required": ["logprobs"]},
    }


class Trail:
    """A reply's log probabilities (`asked`: its request asked for them), one per token in the
    order its events bring them: `follow` takes them from the events as they pass, `take` hands
    out those not shown yet, `all` keeps every one."""

    def __init__(self, tokenizer: Tokenizer, asked: bool) -> None:
        self.tokenizer, self.asked = tokenizer, asked
        self.all: list[TokenLogprob] = []
        self._shown = 0

    @classmethod
    def of(cls, engine: EnginePort, logprobs: int | None) -> Trail:
        """The trail of a request to `engine` that asks the sampler for `logprobs`; a 501 when
        it asks and the engine cannot give them (vLLM replicas)."""
        if logprobs is not None:
            engine.capabilities.require("logprobs", "log probabilities")
        return cls(engine.model.tokenizer, logprobs is not None)

    async def follow(
        self, items: AsyncIterator[T], kept: Callable[[], int] | None = None
    ) -> AsyncIterator[T]:
        """`items` (engine events, or pairs ending with one) unchanged, their log probabilities
        kept as they pass. `kept` says how many tokens the reply keeps (`ReplyStream.output`):
        when the reply is taken back, the log probabilities of the tokens it dropped go too
        (one a token; those a stream has shown already stay shown)."""
        async for item in items:
            event = item[-1] if isinstance(item, tuple) else item
            assert isinstance(event, TokenEvent)
            self.all += event.logprobs or ()
            if self.asked and kept is not None and kept() < len(self.all):
                del self.all[kept() :]
                self._shown = min(self._shown, len(self.all))
            yield item

    def take(self) -> list[TokenLogprob]:
        """The log probabilities that came since the last `take`."""
        new = self.all[self._shown :]
        self._shown = len(self.all)
        return new

    def entries(self, logprobs: Sequence[TokenLogprob]) -> list[dict[str, Any]]:
        return entries(self.tokenizer, logprobs)


def entries(tokenizer: Tokenizer, logprobs: Sequence[TokenLogprob]) -> list[dict[str, Any]]:
    """Chat Completions' `logprobs.content` and Responses' `logprobs`: per token its text,
    log probability, bytes and `top_logprobs` (as many as asked, most likely first)."""
    return [
        _entry(tokenizer, lp.token_id, lp.logprob)
        | {"top_logprobs": [_entry(tokenizer, token, value) for token, value in lp.top]}
        for lp in logprobs
    ]


def legacy_json(
    tokenizer: Tokenizer, logprobs: Sequence[TokenLogprob], offset: int
) -> dict[str, Any]:
    """Legacy Completions' `logprobs`: the tokens, their log probabilities, per token a map of
    the likeliest tokens' (the chosen one always among them, as OpenAI's API does), and where
    each token's text starts in the choice's text (`offset`: where the first one does)."""
    tokens, starts = [], []
    for lp in logprobs:
        starts.append(offset)
        tokens.append(token_text(tokenizer, lp.token_id))
        offset += len(tokens[-1])
    return {
        "tokens": tokens,
        "token_logprobs": [_finite(lp.logprob) for lp in logprobs],
        "top_logprobs": [_top_map(tokenizer, lp) for lp in logprobs],
        "text_offset": starts,
    }


def token_text(tokenizer: Tokenizer, token_id: int) -> str:
    """A token's text; a piece of a character as `bytes:` and its bytes escaped."""
    data = tokenizer.token_bytes(token_id)
    try:
        return data.decode()
    except UnicodeDecodeError:
        return "bytes:" + "".join(f"\\x{byte:02x}" for byte in data)


def _entry(tokenizer: Tokenizer, token_id: int, logprob: float) -> dict[str, Any]:
    return {
        "token": token_text(tokenizer, token_id),
        "logprob": _finite(logprob),
        "bytes": list(tokenizer.token_bytes(token_id)),
    }


def _top_map(tokenizer: Tokenizer, lp: TokenLogprob) -> dict[str, float]:
    top = {token_text(tokenizer, token): _finite(value) for token, value in lp.top}
    return top | {token_text(tokenizer, lp.token_id): _finite(lp.logprob)}


def _finite(logprob: float) -> float:
    return logprob if math.isfinite(logprob) else LOWEST_LOGPROB
