"""Anthropic Messages API: body → prompt → `Request` → engine events → a Message or its events.

Translation only: the body and its prompt are read in anthropic_request.py,
SSE bytes live in streaming.py, error shapes in errors.py.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from functools import partial
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from semantic.api import limits, pipeline
from semantic.api.admin import engine_of
from semantic.api.agents import agent_id_from, named_agent
from semantic.api.anthropic_request import (
    MessagesBody,
    PromptBody,
    git_status_of,
    refuse_images,
    render_prompt,
    tool_use_of,
)
from semantic.api.auth import caller_of
from semantic.api.bodies import parse_body
from semantic.api.breakpoints import BreakpointRender
from semantic.api.errors import anthropic_error_event
from semantic.api.git_snapshots import GitSnapshots
from semantic.api.limits import OutputBudget
from semantic.api.openapi import STREAMED_OR_JSON, error_responses, json_body
from semantic.api.pipeline import ChatRequest, Sampling
from semantic.api.prompt_bounds import PromptRoute
from semantic.api.seal import Seals
from semantic.api.streaming import (
    PING,
    anthropic_event,
)
from semantic.api.thinking import Thinking, anthropic_switch, seals_of, shape_reply
from semantic.api.tool_use import (
    Reasoning,
    ReasoningDelta,
    ReplyEvent,
    ReplyPart,
    ToolUse,
    whole_reply,
)
from semantic.api.usage import final_usage, messages_usage
from semantic.core import (
    FinishReason,
    TokenEvent,
    Usage,
)
from semantic.models.served import ServedModel
from semantic.text import client_json
from semantic.text.tools import ArgumentsDelta, CallEnd, CallStart, TextDelta

router = APIRouter(route_class=PromptRoute)

# Claude Code (2.1) gives up on a stream after 300 s without an event other than `ping` (its SDK
# drops pings before its watchdog sees them) and asks again without streaming: a cold prefill
# of its ~19K-token first request on a small CPU takes longer. So once no other event has gone
# out for this long, the heartbeat is an empty delta instead of a ping.
EMPTY_DELTA_AFTER_S = 120.0


# -- the agent -----------------------------------------------------------------------------

# Claude Code before ~2.1: `user_<hash>_account_<uuid>_session_<uuid>`.
_LEGACY_SESSION = re.compile(r"_session_([0-9A-Za-z-]++)$")  # possessive: never backtracks
# Claude Code names its subagents (the Task tool) in a header; they share the session id.
SUBAGENT_HEADER = "x-claude-code-agent-id"
# Claude Code 2.x sends its session id as a header on every request.
CLAUDE_CODE_SESSION_HEADER = "x-claude-code-session-id"


def agent_id(body: MessagesBody, headers: Mapping[str, str]) -> str | None:
    """The agent a request continues: the one it names (`x-session-id`, as in every API), else
    the one its `metadata.user_id` stands for, else Claude Code's session header
    (`x-claude-code-session-id`), else none (prefix reuse still works by content).

    Claude Code puts its session in `metadata.user_id` of every request, side requests (a
    title, a bash-prefix check) included. Those carry no tools; naming them after the session
    would make a one-off prompt the agent's history, so they stay anonymous, and their blocks
    are the first to leave the pool instead of the working conversation's."""
    named = named_agent(headers)
    user_id = body.metadata.user_id if body.metadata is not None else None
    if named is not None:
        return named
    session = _session_in(user_id) if user_id else None
    if user_id and session is None:
        return agent_id_from(user_id)
    session = session or headers.get(CLAUDE_CODE_SESSION_HEADER) or None
    if session is None or not body.tools:
        return None
    subagent = headers.get(SUBAGENT_HEADER)
    return agent_id_from(f"{session}.{subagent}" if subagent else session)


def session_of(body: PromptBody, headers: Mapping[str, str]) -> str | None:
    """The Claude Code session a request belongs to (subagents' included): the session in its
    `metadata.user_id`, else its `x-claude-code-session-id` header; None for other clients."""
    metadata = body.metadata if isinstance(body, MessagesBody) else None  # count_tokens: none
    user_id = metadata.user_id if metadata is not None else None
    return (_session_in(user_id) if user_id else None) or headers.get(CLAUDE_CODE_SESSION_HEADER)


def first_git_status(request: Request, body: PromptBody, *, keep: bool = True) -> str | None:
    """The `gitStatus:` section the request's session started with (api/git_snapshots.py),
    this request's own when it is the first one seen (and then kept, unless `keep` is False);
    None when the request has no such section or names no session."""
    status, session = git_status_of(body), session_of(body, request.headers)
    if status is None or session is None:
        return status
    snapshots: GitSnapshots = request.app.state.git_snapshots
    owner = caller_of(request).owner
    if not keep:
        return snapshots.peek(owner, session) or status
    return snapshots.first(owner, session, status)


def _session_in(user_id: str) -> str | None:
    """The session id inside Claude Code's `user_id`: a JSON object `{"device_id",
    "account_uuid", "session_id"}`, or the older `…_session_<uuid>` string."""
    try:
        decoded = client_json.loads(user_id)
    except client_json.NotJson:
        legacy = _LEGACY_SESSION.search(user_id)
        return legacy.group(1) if legacy else None
    session = decoded.get("session_id") if isinstance(decoded, dict) else None
    return session if isinstance(session, str) and session else None


# -- the response --------------------------------------------------------------------------


def stop_reason(event: TokenEvent, requested_max_tokens: int, called: bool = False) -> str:
    """tool_use (the reply called tools), end_turn, stop_sequence, max_tokens (the asked limit),
    or model_context_window_exceeded (the context ran out first: Claude Code then compacts
    instead of retrying)."""
    if called:
        return "tool_use"
    if event.stop_string is not None:
        return "stop_sequence"
    if event.finish_reason is not FinishReason.LENGTH:
        return "end_turn"
    assert event.usage is not None
    if event.usage.completion_tokens >= requested_max_tokens:
        return "max_tokens"
    return "model_context_window_exceeded"


class _Reply:
    """One response's identity and accounting, shared by its events or its single body.
    Thinking blocks are sealed with `seals`; `show_thinking` False (`display: "omitted"`):
    they carry neither their text nor a seal that holds it."""

    def __init__(
        self,
        model: str,
        prompt_tokens: int,
        requested_max_tokens: int,
        seals: Seals,
        show_thinking: bool = True,
        breakpoint_ttls: tuple[str, ...] = (),
    ) -> None:
        self.id = f"msg_{uuid.uuid4().hex}"
        self.breakpoint_ttls = breakpoint_ttls  # "5m" or "1h", one per breakpoint honoured
        self.model = model
        self.prompt_tokens = prompt_tokens
        self.requested = requested_max_tokens
        self.silent = requested_max_tokens == 0  # a pre-warm: its one token is not an answer
        self.show_thinking = show_thinking
        self.seals = seals
        self.blocks = _Blocks(seals, show_thinking)
        self.last_event = time.monotonic()  # when an event other than `ping` last went out

    def message(
        self, content: list[dict[str, Any]], final: TokenEvent | None = None, called: bool = False
    ) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": content,
            "stop_reason": None if final is None else stop_reason(final, self.requested, called),
            "stop_sequence": None if final is None else final.stop_string,
            "usage": self.usage(None if final is None else final.usage),
        }

    def usage(self, usage: Usage | None) -> dict[str, object]:
        """Before the end, all of the prompt counts as input (the engine tells what it found
        cached only when it finishes); `message_delta` then carries the final split."""
        if usage is None:
            return messages_usage(self.prompt_tokens, 0, 0)
        output = 0 if self.silent else usage.completion_tokens
        return final_usage(usage, output, self.breakpoint_ttls)

    async def events(
        self, parsed: AsyncIterator[tuple[list[ReplyEvent], TokenEvent]], tools: ToolUse
    ) -> AsyncGenerator[str, None]:
        """The event stream: message_start and a ping at once (before the prompt is prefilled),
        text and tool_use blocks one after another (each once it has content, or opened by
        `heartbeat`), message_delta, message_stop; or an `error` event if the engine fails
        after the 200."""
        yield self._sent({"type": "message_start", "message": self.message([])})
        yield PING
        async for tool_events, event in parsed:
            if event.error is not None:
                yield _error_event(event.error)
                return
            for tool_event in [] if self.silent else tool_events:
                for payload in self.blocks.payloads(tool_event):
                    yield self._sent(payload)
            if event.final:
                for payload in self.blocks.close():
                    yield self._sent(payload)
                end = self.message([], event, tools.called(event))
                delta = {"stop_reason": end["stop_reason"], "stop_sequence": end["stop_sequence"]}
                yield self._sent({"type": "message_delta", "delta": delta, "usage": end["usage"]})
                yield self._sent({"type": "message_stop"})
                return

    def heartbeat(self) -> str:
        """What goes out while nothing else does (a long prefill): a `ping`, or, once no other
        event has for `EMPTY_DELTA_AFTER_S`, an empty delta (`_Blocks.keep_alive`), which
        Claude Code counts as life where it ignores pings. (It runs while `events` waits on the
        engine, so `blocks` is between two events.) A pre-warm's content stays empty."""
        if self.silent or time.monotonic() - self.last_event < EMPTY_DELTA_AFTER_S:
            return PING
        return "".join(self._sent(payload) for payload in self.blocks.keep_alive())

    def _sent(self, payload: dict[str, Any]) -> str:
        self.last_event = time.monotonic()
        return anthropic_event(payload)

    async def collect(
        self, parsed: AsyncIterator[tuple[list[ReplyEvent], TokenEvent]], tools: ToolUse
    ) -> dict[str, Any]:
        parts, final = await whole_reply(parsed)
        # Never an empty text block: the real API rejects one echoed back.
        blocks = [self._content_block(part) for part in parts if part]
        return self.message([] if self.silent else blocks, final, tools.called(final))

    def _content_block(self, part: ReplyPart) -> dict[str, Any]:
        if isinstance(part, str):
            return {"type": "text", "text": part}
        if isinstance(part, Reasoning):
            shown = part.text if self.show_thinking else ""
            return {"type": "thinking", "thinking": shown, "signature": self.seals.seal(shown)}
        return {"type": "tool_use", "id": tool_use_id(), "name": part.name, "input": part.input()}


def tool_use_id() -> str:
    return f"toolu_{uuid.uuid4().hex[:24]}"


class _Blocks:
    """The content blocks of a streamed reply, numbered 0, 1, 2… in order: a block starts when
    its first content comes (or a keep-alive needs one) and stops before the next one starts
    (Claude Code rejects interleaved or re-typed blocks). A thinking block ends with its seal
    (`signature_delta`); its text streams, and its seal holds it, only when `show_thinking`."""

    def __init__(self, seals: Seals, show_thinking: bool = True) -> None:
        self.index = -1
        self.open: str | None = None  # the type of the block being streamed
        self.seals = seals
        self.show_thinking = show_thinking
        self._thinking: list[str] = []  # the open thinking block's text, for its seal

    def payloads(self, event: ReplyEvent) -> list[dict[str, Any]]:
        if isinstance(event, ReasoningDelta):
            start = [] if self.open == "thinking" else self._start(_THINKING_START)
            self._thinking.append(event.text)
            if not self.show_thinking:
                return start
            return [*start, self._delta({"type": "thinking_delta", "thinking": event.text})]
        if isinstance(event, TextDelta):
            start = [] if self.open == "text" else self._start({"type": "text", "text": ""})
            return [*start, self._delta({"type": "text_delta", "text": event.text})]
        if isinstance(event, CallStart):
            block = {"type": "tool_use", "id": tool_use_id(), "name": event.name, "input": {}}
            return self._start(block)
        if isinstance(event, ArgumentsDelta):
            return [self._delta({"type": "input_json_delta", "partial_json": event.json})]
        assert isinstance(event, CallEnd)
        return self.close()

    def keep_alive(self) -> list[dict[str, Any]]:
        """A delta that adds nothing, to the open block, or to a text block opened for it: the
        reply's text goes on in that block; a call or thinking that comes first stops it, empty
        (clients take an empty text block; semantic drops it when it comes back)."""
        start = [] if self.open else self._start({"type": "text", "text": ""})
        return [*start, self._delta(_EMPTY_DELTAS[self.open or "text"])]

    def close(self) -> list[dict[str, Any]]:
        if self.open is None:
            return []
        sealed = []
        if self.open == "thinking":
            shown = "".join(self._thinking) if self.show_thinking else ""
            signature = self.seals.seal(shown)
            sealed = [self._delta({"type": "signature_delta", "signature": signature})]
            self._thinking = []
        self.open = None
        return [*sealed, {"type": "content_block_stop", "index": self.index}]

    def _start(self, block: dict[str, Any]) -> list[dict[str, Any]]:
        stop = self.close()
        self.index += 1
        self.open = block["type"]
        start = {"type": "content_block_start", "index": self.index, "content_block": block}
        return [*stop, start]

    def _delta(self, delta: dict[str, Any]) -> dict[str, Any]:
        return {"type": "content_block_delta", "index": self.index, "delta": delta}


_THINKING_START = {"type": "thinking", "thinking": "", "signature": ""}
_EMPTY_DELTAS: dict[str, dict[str, Any]] = {
    "text": {"type": "text_delta", "text": ""},
    "thinking": {"type": "thinking_delta", "thinking": ""},
    "tool_use": {"type": "input_json_delta", "partial_json": ""},
}


def _error_event(exc: Exception) -> str:
    return anthropic_event(anthropic_error_event(exc))


# -- the routes ----------------------------------------------------------------------------


@router.post(
    "/v1/messages",
    openapi_extra=json_body(MessagesBody, prefix="Anthropic"),
    responses={200: STREAMED_OR_JSON, **error_responses("anthropic", 400, 404, 413, 500, 529)},
)
async def create_message(request: Request) -> Response:
    body = await parse_body(request, MessagesBody)
    refuse_images(body)
    agent = agent_id(body, request.headers)
    sampling = sampling_of(body)
    engine = pipeline.admit(
        request, body.model, len(body.messages), len(body.tools or []), sampling, agent
    )
    seals = seals_of(request)
    chat = _chat_request(request, body, engine.model, sampling, agent, seals)
    assert isinstance(chat.render, BreakpointRender)
    reply = await pipeline.start(request, engine, chat)
    # Any model name is served by the loaded model, and echoed back as asked.
    assert reply.asked is not None  # Anthropic's budget clamps: there always is one
    shown, labels = chat.thinking.shown, chat.render.labels
    message = _Reply(body.model, reply.prompt_tokens, reply.asked, seals, shown, labels)
    return await reply.submitted.respond(
        request,
        body.stream,
        partial(message.events, reply.parsed, chat.tools),
        partial(message.collect, reply.parsed, chat.tools),
        _error_event,
        message.heartbeat,
    )


def sampling_of(body: MessagesBody) -> Sampling:
    """The sampling fields of a Messages body."""
    stops = tuple(body.stop_sequences or ())
    return Sampling(
        body.temperature, body.top_p, body.top_k, stop=stops, stop_param="stop_sequences"
    )


def _chat_request(
    request: Request,
    body: MessagesBody,
    model: ServedModel,
    sampling: Sampling,
    agent: str | None,
    seals: Seals,
) -> ChatRequest:
    """The body as the chat pipeline reads it: its prompt rendered with its breakpoints found
    (api/breakpoints.py), thinking blocks' seals opened, and the git status its Claude Code
    session started with; its `max_tokens` clamped (`OutputBudget`)."""
    tools, thinking = tool_use_of(model, body), thinking_of(model, body)
    max_ttl_s = request.app.state.settings.max_retention_ttl_s
    git_status = first_git_status(request, body)
    render = BreakpointRender(model, body, max_ttl_s, seals=seals, git_status=git_status)
    return ChatRequest(
        tools=tools,
        thinking=thinking,
        render=render,
        budget=OutputBudget(body.max_tokens, body.max_tokens, clamp=True),
        sampling=sampling,
        output=body.output(),
        agent=agent,
        breakpoints=lambda _: render.breakpoints,
    )


@router.post(
    "/v1/messages/count_tokens",
    openapi_extra=json_body(PromptBody, prefix="Anthropic"),
    responses=error_responses("anthropic", 400, 404, 413, 500),
)
async def count_tokens(request: Request) -> dict[str, int]:
    """Exactly the prompt tokens /v1/messages would prefill for the same body, cached or not."""
    body = await parse_body(request, PromptBody)
    model, settings = engine_of(request).model, request.app.state.settings
    model.check_requested_name(body.model, settings.strict_model_names)
    limits.check_counts(settings, len(body.messages), len(body.tools or []))
    refuse_images(body)
    tools, thinking = tool_use_of(model, body), thinking_of(model, body)
    git_status = first_git_status(request, body, keep=False)  # a count keeps nothing
    render = partial(render_prompt, model, body, seals=seals_of(request), git_status=git_status)
    body_bytes = len(await request.body())
    prompt_ids, _ = await shape_reply(model, body.output(), tools, thinking, render, body_bytes)
    return {"input_tokens": len(prompt_ids)}


def thinking_of(model: ServedModel, body: PromptBody) -> Thinking:
    """The request's thinking: `thinking.type`, `output_config.effort`, `display`."""
    kind = body.thinking.type if body.thinking is not None else None
    effort = body.output_config.effort if body.output_config is not None else None
    shown = body.thinking is None or body.thinking.display != "omitted"
    return Thinking.of(model, anthropic_switch(kind, effort), shown=shown)


@router.head("/", response_class=Response)  # an empty 200: no JSON content to document
async def probe() -> Response:
    """Claude Code's connectivity check at startup."""
    return Response()
