"""One turn of a stateful agent (`POST /v1/agents/{id}/generate`): hold the agent, render its whole
conversation and the new message through the model's chat template (its cache makes it pay only
for the new tokens), run it, and make the reply part of the conversation, durably, before the
answer goes out. Its JSON answer and its SSE events are defined here.

SSE events, each `event: <type>` plus one `data:` line of JSON whose `type` is the same name:
`delta` (`text`), any number; then `done` (the whole `Generation`) or `error` (`error`, in the
OpenAI error shape). Keep-alive comments fill long prefills.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from collections.abc import AsyncIterator
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from semantic.api import limits
from semantic.api.errors import error_payload
from semantic.api.streaming import named_event, whole_answer
from semantic.cache.agents.conversation import Conversation, SamplingDefaults
from semantic.core import DefaultSampling, FinishReason, SamplingParams, TokenEvent
from semantic.core import Request as GenerationRequest
from semantic.engine.agent_door import TurnHold
from semantic.engine.port import EnginePort
from semantic.errors import Overloaded
from semantic.models.served import ServedModel
from semantic.settings.settings import Settings

StopString = Annotated[str, Field(min_length=1)]


class Sampling(BaseModel):
    """Sampling settings: an agent's defaults, or one call's overrides of them."""

    model_config = ConfigDict(extra="forbid", strict=True)
    temperature: float | None = Field(None, ge=0, le=2, description="0 is greedy.")
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=0, description="0 is off.")
    max_tokens: int | None = Field(
        None,
        ge=1,
        description="Most tokens to generate. A call's own value must fit the context (else "
        "400 context_length_exceeded); the agent's or the server's default is cut to fit.",
    )
    stop: StopString | list[StopString] | None = None  # how many, how long: api/limits.py
    seed: int | None = None

    def settings(self) -> SamplingDefaults:
        stop = [self.stop] if isinstance(self.stop, str) else self.stop
        return SamplingDefaults(
            self.temperature,
            self.top_p,
            self.top_k,
            self.max_tokens,
            None if stop is None else tuple(stop),
            self.seed,
        )


class GenerateBody(Sampling):
    message: str = Field(min_length=1, description="The new user message.")
    stream: bool = Field(False, description="Answer with server-sent events.")


class GenerationUsage(BaseModel):
    prompt_tokens: int = Field(description="The whole rendered conversation.")
    cached_tokens: int = Field(description="Of those, served from the agent cache.")
    completion_tokens: int
    total_tokens: int


class Generation(BaseModel):
    id: str
    object: str = "agent.generation"
    agent_id: str
    model: str
    created: int
    text: str
    finish_reason: str = Field(description="`stop` or `length`.")
    stop_sequence: str | None = Field(description="The stop string that ended it, if one did.")
    messages: int = Field(description="Messages in the conversation now, the reply included.")
    usage: GenerationUsage


class Turn:
    """A generate call's hold on its agent (`AgentDoor.begin_turn`), then one of: `commit` (the
    reply joins the conversation and the hold ends) or a release: `abandon`, or, for a stream
    that never ran or was dropped, this object's garbage collection, so a hold never outlives
    its call. The hold is keyed by its turn id, so a late release never frees a later turn."""

    def __init__(self, engine: EnginePort, hold: TurnHold) -> None:
        self.engine, self.hold = engine, hold
        self.conversation = Conversation()
        self.message = ""
        self._release = weakref.finalize(self, engine.agent_door.release_turn, hold)

    @classmethod
    async def begin(cls, engine: EnginePort, hold: TurnHold, message: str) -> Turn:
        """Take the hold for a turn of `message` (NotFound, Conflict when another call holds
        the agent, ConversationTooLarge past the limit). The release is armed first: a call
        cancelled while the hold is taken still lets it go."""
        turn = cls(engine, hold)
        turn.conversation = await engine.agent_door.begin_turn(hold, message)
        return turn

    @property
    def agent_id(self) -> str:
        return self.hold.key.agent_id

    def abandon(self) -> None:
        """Release the hold without changing the conversation (a no-op after `commit`)."""
        self._release()

    async def request(self, body: GenerateBody, settings: Settings) -> GenerationRequest:
        """The engine request for the conversation plus `body.message`; a conversation that
        leaves no room for the answer is a context overflow, and the request limits apply
        (api/limits.py)."""
        self.message = body.message
        engine = self.engine
        messages = self.conversation.template_messages(body.message)
        prompt = await asyncio.to_thread(_render, engine.model, messages)
        limits.check_prompt(settings, len(prompt), "message")
        defaults, overrides = self.conversation.defaults, body.settings()
        chosen = defaults.overridden_by(overrides)
        limits.check_stops(settings, chosen.stop or (), "stop")
        default_max_tokens = defaults.max_tokens or settings.default_max_tokens
        budget = limits.OutputBudget(
            overrides.max_tokens, default_max_tokens, prompt_param="message"
        )
        max_tokens = limits.output_budget(settings, budget, len(prompt), engine.max_seq_tokens)
        return GenerationRequest(
            request_id=self.hold.turn_id,
            prompt_token_ids=prompt,
            sampling=_sampling_params(chosen, max_tokens, engine.model.sampling),
            agent_id=self.agent_id,
            owner=self.hold.key.owner,
        )

    async def answer(self, events: AsyncIterator[TokenEvent]) -> dict[str, Any]:
        """The whole reply as one JSON body, once it is part of the conversation."""
        text, final = await whole_answer(events)
        return await self._commit(text, final)

    async def frames(self, events: AsyncIterator[TokenEvent]) -> AsyncIterator[str]:
        """The reply as SSE events; `done` goes out once it is part of the conversation."""
        text: list[str] = []
        try:
            async for event in events:
                if event.error is not None:
                    yield error_event(event.error)
                    return
                if event.text:
                    text.append(event.text)
                    yield named_event("delta", {"type": "delta", "text": event.text})
                if event.final:
                    generation = await self._commit("".join(text), event)
                    yield named_event("done", {"type": "done", **generation})
        finally:
            self.abandon()

    async def _commit(self, text: str, final: TokenEvent) -> dict[str, Any]:
        if final.finish_reason is FinishReason.ABORT or final.usage is None:
            raise Overloaded("the generation was cancelled: the server is stopping")
        conversation = self.conversation.with_turn(self.message, text)
        self._release.detach()  # the commit releases the hold, whatever becomes of it
        await self.engine.agent_door.commit_turn(self.hold, conversation)
        usage = final.usage
        return Generation(
            id=f"gen_{self.hold.turn_id.removeprefix('req_')}",
            agent_id=self.agent_id,
            model=self.engine.model.name,
            created=int(time.time()),
            text=text,
            finish_reason="length" if final.finish_reason is FinishReason.LENGTH else "stop",
            stop_sequence=final.stop_string,
            messages=len(conversation.messages),
            usage=GenerationUsage(
                prompt_tokens=usage.prompt_tokens,
                cached_tokens=usage.cached_tokens,
                completion_tokens=usage.completion_tokens,
                total_tokens=usage.prompt_tokens + usage.completion_tokens,
            ),
        ).model_dump()


def error_event(exc: Exception) -> str:
    return named_event("error", {"type": "error", **error_payload(exc)})


def _render(model: ServedModel, messages: list[dict[str, Any]]) -> list[int]:
    return model.tokenizer.encode(model.chat_template.render(messages))


def _sampling_params(
    chosen: SamplingDefaults, max_tokens: int, model_defaults: DefaultSampling
) -> SamplingParams:
    return SamplingParams(
        **model_defaults.fill(chosen.temperature, chosen.top_p, chosen.top_k),
        seed=chosen.seed,
        max_tokens=max_tokens,
        stop=chosen.stop or (),
    )
