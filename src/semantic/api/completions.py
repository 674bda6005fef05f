"""OpenAI's legacy Completions (`/v1/completions`): raw text or token ids in, text out, no chat
template, no tools, no agent beyond a `session_id`. Body → prompt ids → engine events → JSON or
SSE chunks; what it shares with Chat Completions is in `openai_fields.py`, and the admission,
submission and streaming every API goes through in `pipeline.py` and `streaming.py`.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from functools import partial
from typing import Annotated, Any, cast

from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import ConfigDict, Field, WithJsonSchema

from semantic.api import pipeline
from semantic.api.agents import named_agent
from semantic.api.limits import OutputBudget
from semantic.api.logprobs import MAX_LEGACY_LOGPROBS, Trail, legacy_json
from semantic.api.openai_fields import (
    GENERATION_RESPONSES,
    GenerationFields,
    error_chunk,
    finish_reason_json,
    sampling_of,
)
from semantic.api.prompt_bounds import PromptRoute
from semantic.api.streaming import DONE, KEEP_ALIVE, data_event, whole_answer
from semantic.api.usage import chat_usage
from semantic.core import TokenEvent, TokenLogprob
from semantic.errors import InvalidRequest
from semantic.models.served import ServedModel

router = APIRouter(route_class=PromptRoute)

LEGACY_MAX_TOKENS = 16  # the legacy API's default when a request gives no max_tokens

# One prompt: text or token ids, alone or as a list of one. What the document says of it is
# what `completion_prompt` and the engine check by hand (with their own messages): not empty,
# one prompt, ids from 0 (and within the served model's vocabulary, which no schema knows).
_TEXT = {"type": "string", "minLength": 1}
_IDS = {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 1}
_ONE = {"minItems": 1, "maxItems": 1}
Prompt = Annotated[
    str | list[int] | list[str] | list[list[int]],
    WithJsonSchema(
        {
            "anyOf": [
                _TEXT,
                _IDS,
                {"type": "array", "items": _TEXT, **_ONE},
                {"type": "array", "items": _IDS, **_ONE},
            ]
        }
    ),
]


class CompletionRequest(GenerationFields):
    prompt: Prompt
    echo: bool = False
    logprobs: int | None = Field(None, ge=0, le=MAX_LEGACY_LOGPROBS)
    # Accepted at their neutral values only (`refuse_unsupported`).
    best_of: int | None = Field(None, ge=1, json_schema_extra={"maximum": 1})
    suffix: str | None = Field(None, json_schema_extra={"maxLength": 0})

    # The prompt's log probabilities are not computed: no `logprobs` with `echo`.
    model_config = ConfigDict(
        json_schema_extra={
            "if": {"properties": {"logprobs": {"type": "integer"}}, "required": ["logprobs"]},
            "then": {"properties": {"echo": {"const": False}}},
        }
    )


def refuse_unsupported(body: CompletionRequest) -> None:
    """A 400 that names the first field asking for something this server does not do."""
    refused = [
        ("n", body.n != 1, "only n=1 is supported"),
        ("best_of", body.best_of not in (None, 1), "only best_of=1 is supported"),
        (
            "logprobs",
            body.logprobs is not None and body.echo,
            "logprobs with echo (the prompt's log probabilities) are not supported",
        ),
        ("suffix", bool(body.suffix), "suffix is not supported"),
    ]
    for param, asked, message in refused:
        if asked:
            raise InvalidRequest(message, param=param)


def completion_prompt(model: ServedModel, prompt: Prompt) -> tuple[list[int], str]:
    """The prompt's token ids and its text (what `echo` puts before the answer). Text is
    tokenized as is, after BOS where the model expects one on raw text; token ids are taken
    as they are, once checked against the vocabulary."""
    single = _single_prompt(prompt)
    if isinstance(single, str):
        ids = model.tokenizer.encode(single)
        bos = model.tokenizer.bos_token_id
        return ([bos, *ids] if model.tokenizer.add_bos and bos is not None else ids), single
    vocab = model.config.vocab_size
    outside = next((token for token in single if not 0 <= token < vocab), None)
    if outside is not None:
        raise InvalidRequest(
            f"prompt: token id {outside} is outside the vocabulary (0 to {vocab - 1})",
            param="prompt",
        )
    return single, model.tokenizer.decode(single)


def _single_prompt(prompt: Prompt) -> str | list[int]:
    if isinstance(prompt, str) or not prompt or isinstance(prompt[0], int):
        return cast("str | list[int]", prompt)
    batch = cast("list[str] | list[list[int]]", prompt)
    if len(batch) > 1:
        raise InvalidRequest("prompt: only one prompt per request is supported", param="prompt")
    return batch[0]


@router.post("/v1/completions", responses=GENERATION_RESPONSES)
async def completions(body: CompletionRequest, request: Request) -> Response:
    refuse_unsupported(body)
    agent = named_agent(request.headers, body.session_id, param="session_id")
    sampling = sampling_of(body)
    engine = pipeline.admit(request, body.model, 0, 0, sampling, agent)
    trail = Trail.of(engine, body.logprobs)
    prompt_ids, prompt_text = await asyncio.to_thread(completion_prompt, engine.model, body.prompt)
    budget = OutputBudget(body.max_tokens, LEGACY_MAX_TOKENS, prompt_param="prompt")
    params = partial(sampling.params, engine.model.sampling, logprobs=body.logprobs)
    submitted = await pipeline.submit(request, engine, prompt_ids, budget, params, agent)
    echo = prompt_text if body.echo else ""
    completion = _TextCompletion(int(time.time()), body.model, echo, trail)
    followed = trail.follow(submitted.events)
    return await submitted.respond(
        request,
        body.stream,
        partial(completion.chunks, followed, body.include_usage),
        partial(completion.collect, followed),
        error_chunk,
        KEEP_ALIVE,
    )


class _TextCompletion:
    """One legacy completion's identity, shared by its chunks or its single JSON body. `echo`
    is the text that goes before the answer: the prompt's, or "" without `echo`. `trail` holds
    its tokens' log probabilities: each chunk carries those that came since the last one."""

    def __init__(self, created: int, model: str, echo: str, trail: Trail) -> None:
        self.id, self.created, self.model = f"cmpl-{uuid.uuid4().hex}", created, model
        self.echo, self.trail = echo, trail
        self._offset = len(echo)  # where the next token's text starts in the choice's text

    def _body(self, choices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": choices,
            **extra,
        }

    def _choice(
        self,
        text: str,
        finish_reason: str | None = None,
        logprobs: list[TokenLogprob] | None = None,
    ) -> dict[str, Any]:
        shown = None
        if self.trail.asked and logprobs is not None:
            shown = legacy_json(self.trail.tokenizer, logprobs, self._offset)
            self._offset += sum(map(len, shown["tokens"]))
        return {"text": text, "index": 0, "logprobs": shown, "finish_reason": finish_reason}

    async def chunks(
        self, events: AsyncIterator[TokenEvent], include_usage: bool
    ) -> AsyncIterator[str]:
        if self.echo:
            yield data_event(self._body([self._choice(self.echo)]))
        async for event in events:
            if event.error is not None:
                yield error_chunk(event.error)
                return
            finish = (
                None if event.finish_reason is None else finish_reason_json(event.finish_reason)
            )
            if event.text or finish is not None:
                choice = self._choice(event.text, finish, self.trail.take())
                yield data_event(self._body([choice]))
            if finish is not None and include_usage and event.usage is not None:
                yield data_event(self._body([], usage=chat_usage(event.usage)))
        yield DONE

    async def collect(self, events: AsyncIterator[TokenEvent]) -> dict[str, Any]:
        text, final = await whole_answer(events)
        assert final.usage is not None
        reason = finish_reason_json(final.finish_reason)
        choice = self._choice(self.echo + text, reason, self.trail.all)
        return self._body([choice], usage=chat_usage(final.usage))
