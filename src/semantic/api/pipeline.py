"""The chat pipeline: one chat request in no protocol's words (`ChatRequest`), and the steps
every chat API runs for it, once and in this order (`admit`, then `start`):

 1. the model's name (`ServedModel.check_requested_name`);
 2. the counts of messages and tools, and the stop strings (api/limits.py);
 3. the agent's rate (api/rate_limits.py), and whether the engine gives log probabilities;
 4. the reply's shape: its grammar, thinking, the prompt rendered and tokenized
    (api/thinking.py: `shape_reply`);
 5. the prompt's bound and the output budget (api/limits.py);
 6. the engine request, submitted (api/cache_miss.py: the miss header);
 7. its events, taken back when a call goes astray (api/reply_stream.py), parsed into text,
    reasoning and calls (api/tool_use.py), their log probabilities kept (api/logprobs.py);
 8. the answer, streamed as server-sent events or whole (`Submitted.respond`).

Chat Completions (api/openai.py), Messages (api/anthropic.py) and Responses
(api/responses.py) each read their body into a `ChatRequest` and write the `Reply`'s events
in their own words; nothing else. Legacy Completions, which has no chat, shares steps 1, 3, 5
and 6 (`admit`, `submit`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from semantic.api import cache_miss, limits, rate_limits
from semantic.api.auth import caller_of
from semantic.api.gate import engine_of
from semantic.api.limits import OutputBudget
from semantic.api.logprobs import Trail
from semantic.api.reply_stream import ReplyStream
from semantic.api.streaming import after_the_200, sse_response, unless_disconnected, with_keep_alive
from semantic.api.structured_output import OutputFormat
from semantic.api.thinking import Render, Thinking, shape_reply
from semantic.api.tool_use import ReplyEvent, ToolUse
from semantic.core import Breakpoint, DefaultSampling, SamplingParams, TokenEvent
from semantic.core import Request as GenerationRequest
from semantic.engine.port import EnginePort
from semantic.models.served import ServedModel
from semantic.observability import bind_agent
from semantic.text.grammar import Grammar

Parsed = AsyncIterator[tuple[list[ReplyEvent], TokenEvent]]


@dataclass(slots=True, frozen=True)
class Sampling:
    """The sampling a request asks for; what it leaves out (None) is the served model's
    recommendation (`ServedModel.sampling`). `stop_param` names the field of `stop`."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    repetition_penalty: float | None = None
    seed: int | None = None
    min_tokens: int = 0
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    stop_param: str = "stop"

    def params(
        self,
        defaults: DefaultSampling,
        max_tokens: int,
        grammar: Grammar | None = None,
        logprobs: int | None = None,
    ) -> SamplingParams:
        """The engine's sampling: these fields, `defaults` for those left out."""
        return SamplingParams(
            **defaults.fill(self.temperature, self.top_p, self.top_k, self.repetition_penalty),
            seed=self.seed,
            max_tokens=max_tokens,
            min_tokens=self.min_tokens,
            stop=self.stop,
            ignore_eos=self.ignore_eos,
            grammar=grammar,
            logprobs=logprobs,
        )


def no_breakpoints(prompt_tokens: int) -> tuple[Breakpoint, ...]:
    return ()


@dataclass(slots=True)
class ChatRequest:
    """A chat request as every API asks it, once its body is read and `admit` let it in: the
    tools the model may call (`tools`) and the answer's format, its thinking, how its prompt
    renders (`render`: the messages in the template's shape, with the reply's forced start),
    its output budget (which names the field that holds the prompt) and sampling, the agent
    it continues, the log probabilities it asks for (`SamplingParams.logprobs`), and the
    breakpoints its prompt keeps (from the prompt's length)."""

    tools: ToolUse
    thinking: Thinking
    render: Render
    budget: OutputBudget
    sampling: Sampling = field(default_factory=Sampling)
    output: OutputFormat | None = None
    agent: str | None = None
    logprobs: int | None = None
    breakpoints: Callable[[int], tuple[Breakpoint, ...]] = no_breakpoints


@dataclass(slots=True)
class Submitted:
    """An engine request in flight: its events, the response headers it brings (the cache
    miss), and the engine serving it."""

    generation: GenerationRequest
    events: AsyncIterator[TokenEvent]
    headers: dict[str, str]
    engine: EnginePort

    def progress(self) -> tuple[int, int] | None:
        """How far its prompt is prefilled (tokens done, in all), for a stream's heartbeat."""
        return self.engine.progress(self.generation.request_id)

    async def respond(
        self,
        request: Request,
        stream: bool,
        frames: Callable[[], AsyncIterator[str]],
        whole: Callable[[], Awaitable[dict[str, Any]]],
        error_frame: Callable[[Exception], str],
        heartbeat: str | Callable[[], str],
    ) -> Response:
        """The answer: `frames` as server-sent events (once the 200 is out a failure is the
        protocol's `error_frame`; `heartbeat` goes out while nothing else does), or the `whole`
        JSON body, given up if the client leaves first."""
        settings = request.app.state.settings
        if stream:
            sent = after_the_200(frames(), self.events, error_frame)
            return sse_response(
                with_keep_alive(sent, settings.keep_alive_s, heartbeat), self.headers
            )
        answer = await unless_disconnected(request, whole())
        return JSONResponse(answer, headers=self.headers)


@dataclass(slots=True)
class Reply:
    """A chat request in flight (`start`): the engine request (`submitted`, its events a
    `ReplyStream`), its events parsed (`parsed`: each engine event with the reply events its
    text makes), their log probabilities (`trail`), the prompt's length, and what the request
    asked of the output (`asked`: the budget as its protocol reads it)."""

    submitted: Submitted
    parsed: Parsed
    trail: Trail
    prompt_tokens: int
    asked: int | None


def admit(
    request: Request, model: str, messages: int, tools: int, stops: Sampling, agent: str | None
) -> EnginePort:
    """Steps 1 to 3 of every generation route: the model's name, the counts and the stop
    strings checked, the agent's rate counted (and the agent named in the log lines). Returns
    the engine that serves the request: the API reads the rest of its body for it (the tools
    and the thinking depend on the model), then `start`s it."""
    engine, settings = engine_of(request), request.app.state.settings
    engine.model.check_requested_name(model, settings.strict_model_names)
    limits.check_counts(settings, messages, tools)
    limits.check_stops(settings, stops.stop, stops.stop_param)
    bind_agent(agent)
    rate_limits.check_agent(request, agent)
    return engine


async def submit(
    request: Request,
    engine: EnginePort,
    prompt_ids: list[int],
    budget: OutputBudget,
    sampling: Callable[[int], SamplingParams],
    agent: str | None,
    breakpoints: tuple[Breakpoint, ...] = (),
) -> Submitted:
    """Steps 5 and 6: the prompt's bound and the output budget checked, and the engine request
    (its sampling made for the budget: `sampling(max_tokens)`) submitted."""
    settings = request.app.state.settings
    limits.check_prompt(settings, len(prompt_ids), budget.prompt_param)
    max_tokens = limits.output_budget(settings, budget, len(prompt_ids), engine.max_seq_tokens)
    generation = GenerationRequest(
        request_id=request.state.request_id,
        prompt_token_ids=prompt_ids,
        sampling=sampling(max_tokens),
        agent_id=agent,
        owner=caller_of(request).owner,
        breakpoints=breakpoints,
    )
    events, headers = await cache_miss.stream(engine, generation)
    return Submitted(generation, events, headers, engine)


async def start(request: Request, engine: EnginePort, chat: ChatRequest) -> Reply:
    """Steps 3 (log probabilities) to 7 for `chat`, which `admit` let in to `engine`; the
    answer is the API's."""
    trail = Trail.of(engine, chat.logprobs)
    model = engine.model
    body_bytes = len(await request.body())
    prompt_ids, grammar = await shape_reply(
        model, chat.output, chat.tools, chat.thinking, chat.render, body_bytes
    )
    sampling = partial(_sampling, chat, model, grammar)
    breakpoints = chat.breakpoints(len(prompt_ids))
    submitted = await submit(
        request, engine, prompt_ids, chat.budget, sampling, chat.agent, breakpoints
    )
    events = ReplyStream(submitted.events, engine, submitted.generation)
    submitted.events = events  # closing it closes whichever request it reads now
    parsed = trail.follow(chat.tools.parse(events), lambda: len(events.output))
    asked = chat.budget.asked(request.app.state.settings)
    return Reply(submitted, parsed, trail, len(prompt_ids), asked)


def _sampling(
    chat: ChatRequest, model: ServedModel, grammar: Grammar | None, max_tokens: int
) -> SamplingParams:
    return chat.sampling.params(model.sampling, max_tokens, grammar, chat.logprobs)


def render_messages(
    model: ServedModel,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    reply_start: str = "",
    template_vars: Mapping[str, Any] | None = None,
) -> list[int]:
    """The prompt of chat-template `messages` and `tools` (OpenAI's function shape), ending
    with `reply_start` (a forced reply's start), `template_vars` the template's switches
    (thinking): what `ChatRequest.render` is for the OpenAI APIs. Tokenized where `shape_reply`
    runs it: a long prompt's on a worker thread, so that it does not stall the event loop."""
    text = model.chat_template.render(messages, tools=tools, **(template_vars or {}))
    return model.tokenizer.encode(text + reply_start)
