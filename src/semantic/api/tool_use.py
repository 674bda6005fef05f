"""Tool use for one request, in any protocol: which tools the model may call and how, the
text prefilled to force a call, and the engine's events turned into text, reasoning and call
events.

The protocol modules read their own `tools` / `tool_choice` shapes into a `ToolChoice`, build
a `ToolUse`, append its `prefill` to the prompt, and frame the events `parse` yields.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from pydantic_core import from_json

from semantic.api.reply_stream import ReplyStream
from semantic.core import FinishReason, OutputGrammar, TokenEvent
from semantic.models.served import ServedModel
from semantic.text.grammar import CallShape, Opening, ToolCallForm
from semantic.text.reasoning import Piece, ReasoningParser, reasoning_format
from semantic.text.reasoning import hidden_markers as reasoning_markers
from semantic.text.tool_formats import hidden_markers, parser_for
from semantic.text.tools import (
    ArgumentsDelta,
    CallEnd,
    CallStart,
    MisnamedCall,
    PlainText,
    TextDelta,
    ToolCallParser,
    ToolEvent,
    renaming_targets,
)

log = logging.getLogger(__name__)
# How much of a reply the debug log shows: enough to see why a call was or was not read.
LOGGED_REPLY_CHARS = 4_000


@dataclass(slots=True, frozen=True)
class ToolChoice:
    """What the client allows. `auto`: the model decides; `required`: it must call a tool
    (`name`, when set); `none`: no call is parsed (the prompt is the same as for `auto`, so the
    cache is too). Without `parallel`, one call at most and generation stops after it."""

    mode: Literal["auto", "required", "none"] = "auto"
    name: str | None = None
    parallel: bool = True


@dataclass(slots=True, frozen=True)
class ReasoningDelta:
    """A piece of the model's reasoning (a thinking model's `<think>` or analysis channel)."""

    text: str


ReplyEvent = ToolEvent | ReasoningDelta


@dataclass(slots=True)
class Reasoning:
    """A whole reply's reasoning (`whole_reply`'s part for it)."""

    text: str


@dataclass(slots=True)
class ParsedCall:
    name: str
    arguments: str  # the JSON text the model wrote: an object, or its start if cut short

    def input(self) -> dict[str, object]:
        """The arguments as an object: as far as they go when cut short (as the SDKs' stream
        accumulators read them)."""
        try:
            value = from_json(self.arguments or "{}", allow_partial=True)
        except ValueError:
            return {}
        return value if isinstance(value, dict) else {}


class ToolUse:
    """The tool side of one request. `parse` keeps its state: one `ToolUse` per response.
    `schemas` holds the tools' argument schemas by name, and `strict` names the tools whose
    arguments must match theirs (`strict: true`): `call_form` says how a grammar holds the
    calls to them."""

    def __init__(
        self,
        model: ServedModel,
        tools: Sequence[str],
        choice: ToolChoice,
        schemas: Mapping[str, dict[str, Any]] | None = None,
        strict: Collection[str] = (),
    ) -> None:
        self._model = model
        self.tools = tuple(tools)
        self.choice = choice
        self.schemas = dict(schemas or {})
        self.strict = frozenset(strict)
        self.active = bool(self.tools) and choice.mode != "none"
        self._format = parser_for(model.chat_template)
        self._hidden = hidden_markers(self._format, model.tokenizer)
        self._parser: ToolCallParser | PlainText = PlainText()
        self._cut_short = False  # the output ended inside a call
        self._reasoning: ReasoningParser | None = None
        self._free_text_grammar = _free_text_grammar(self._format, model)
        self._placeholders = _Placeholders(self.schemas, model.tool_arguments == "required")

    def think(self, parser: ReasoningParser | None, hidden: Mapping[int, str]) -> None:
        """Tell the reply's reasoning from its answer with `parser` (a thinking model's), the
        special tokens in `hidden` put back into the text it reads. Not for a forced call:
        that reply starts as the call."""
        if parser is None or self.prefill:
            return
        self._reasoning = parser
        self._hidden = {**self._hidden, **hidden}

    @property
    def prefill(self) -> str:
        """The text the reply is forced to start with (appended to the prompt): the family's
        call opener, with the name when one tool is required."""
        if not self.active or self.choice.mode != "required":
            return ""
        return self._format.opener(self.choice.name)

    def call_form(self) -> ToolCallForm | None:
        """How a grammar holds this reply's calls to their tools' schemas, from the moment each
        opens, so that a call the model starts always parses and names a tool that exists. A
        forced call (`required`, or a named tool) follows its tool's schema from the prefilled
        opener on; every call the model opens amid free text does too (after the family's
        marker, or as the bare JSON small models write), unless parallel calls are off after a
        forced one. A schema binds for a `strict` tool; for another it is a best effort. None
        when nothing is held: no tools, `none`, a format whose calls a grammar cannot find in
        free text and no forced call, or a format whose arguments are no JSON object
        (Qwen3-Coder's: its values are typed by the schema as they are read instead)."""
        if not self.active or not self._format.JSON_ARGUMENTS:
            return None
        forced = self.choice.mode == "required"
        single = forced and not self.choice.parallel  # the reply ends with its forced call
        openings = self._openings() if self._free_text_grammar and not single else ()
        if not forced and not openings:
            return None
        form = ToolCallForm(self._format.CLOSER, openings=openings)
        if forced:
            names = [self.choice.name] if self.choice.name is not None else list(self.tools)
            form = replace(form, forced=self._shapes(names, self.prefill))
        return form

    def _openings(self) -> tuple[Opening, ...]:
        """The family's trigger, opening a call of any tool, and a bare opener for each tool
        where the family reads calls without their marker (its text names the tool, so ordinary
        JSON in an answer is never held as a call)."""
        trigger = self._format.TRIGGER
        assert trigger is not None
        marked = Opening(trigger, self._shapes(self.tools, trigger), self._format.CLOSER)
        bare = []
        for name in self.tools:
            opener = self._format.bare_opener(name)
            if opener is not None:
                shape = CallShape("", self._held_to(name), name in self.strict)
                bare.append(Opening(opener, (shape,), r"\s*\}", bare=True))
        return (marked, *bare)

    def _shapes(self, names: Sequence[str], written: str) -> tuple[CallShape, ...]:
        """Each tool as a call of it is written after `written` (the prefill, or a trigger)."""
        return self._leading(names, lambda name: self._format.opener(name).removeprefix(written))

    def _leading(self, names: Sequence[str], lead: Callable[[str], str]) -> tuple[CallShape, ...]:
        """Each tool as a call of it, `lead(name)` written before its arguments."""
        return tuple(
            CallShape(lead(name), self._held_to(name), name in self.strict) for name in names
        )

    def _held_to(self, name: str) -> dict[str, Any]:
        """The schema a call of `name` is held to: its tool's."""
        return self.schemas.get(name) or {"type": "object"}

    async def parse(self, reply: ReplyStream) -> AsyncIterator[tuple[list[ReplyEvent], TokenEvent]]:
        """Each engine event with the reasoning, text and call events its text makes (the
        prefill's come with the first). Without `parallel`, after the first call the reply is
        stopped, and the text that still arrives is dropped. A call of a tool that was not
        offered is written again, held to the offered ones, where the reply can be taken back
        (`_renamed`); so is a reply that opens with made-up text, a result or the tools'
        definitions (`_called_instead`)."""
        self._parser = self._new_parser(reply)
        parsed: list[ReplyEvent] = list(self._parser.feed(self.prefill))
        self._written = [(self.prefill, 0)]
        done = False
        async for event in reply:
            if not done:
                self._written.append((self._text_of(event), len(event.token_ids)))
                parsed += self._feed(self._written[-1][0])
                if await self._written_again(reply):
                    yield self._placeholders.dropped(parsed), _tokenless(event)
                    parsed = []
                    continue
                if self._parser.misnamed is not None or self._parser.skipped is not None:
                    parsed += self._parser.release()
                if event.final:
                    parsed += self._finish()
                if not self.choice.parallel and self._parser.calls:
                    parsed, done = _through_first_call(parsed), True
                    if not event.final:
                        reply.stop()
            if event.final:
                self._log_reply("".join(text for text, _ in self._written))
            yield self._placeholders.dropped(parsed), event
            parsed = []

    def _new_parser(self, reply: ReplyStream) -> ToolCallParser | PlainText:
        """A parser for this reply's format, which holds a call of a tool not offered for
        renaming where the reply can be taken back and a grammar can hold the call again: the
        reply is free text, its calls found by the lazy grammar (no forced start, no reasoning
        between the parser and the text)."""
        if not self.active:
            return PlainText()
        parser = self._format(self.tools, self.schemas)
        parser.renaming = (
            reply.can_rewind
            and not self.prefill
            and self._reasoning is None
            and self.call_form() is not None
        )
        return parser

    async def _written_again(self, reply: ReplyStream) -> bool:
        """Whether the reply was taken back, for a call of a tool not offered or made-up text
        the parser holds."""
        misnamed, skipped = self._parser.misnamed, self._parser.skipped
        if misnamed is not None:
            return await self._renamed(reply, misnamed)
        if skipped is not None:
            return await self._called_instead(reply, skipped)
        return False

    async def _called_instead(self, reply: ReplyStream, held_from: int) -> bool:
        """The reply opened with tags the assistant's turn never holds: a tool's result's
        (`<tool_response>`: the model answered for a call it never made, a small model's "The
        file has been created" with no file) or the tools' definitions' (`<tools>`: it wrote its
        prompt back). Take it back to where that began and write a call there instead, of an
        offered tool, held to its schema; False where it cannot be taken back."""
        text = "".join(text for text, _ in self._written)[:held_from]
        kept, kept_text = self._kept_tokens(reply.output, text, held_from)
        if kept < 0:
            return False
        openings = self._openings() if self.choice.parallel else ()
        form = ToolCallForm(
            self._format.CLOSER, forced=self._shapes(self.tools, ""), openings=openings
        )
        grammar = await asyncio.to_thread(self._model.grammars.tool_calls, form)
        log.debug("made-up text written again as a call", extra={"kept": kept})
        await self._rewind(reply, kept, kept_text, grammar)
        return True

    async def _rewind(
        self, reply: ReplyStream, kept: int, kept_text: str, grammar: OutputGrammar
    ) -> None:
        """Go on from the output's first `kept` tokens (`kept_text`) under `grammar`, with a
        new parser that has read them (their events went out before)."""
        await reply.rewind(kept, grammar)
        self._parser = self._new_parser(reply)
        self._parser.feed(kept_text)
        self._written = [(kept_text, kept)]

    async def _renamed(self, reply: ReplyStream, misnamed: MisnamedCall) -> bool:
        """Take the reply back to where `misnamed`'s name begins and go on from there, the name
        and arguments held to the offered tools; False where it cannot be: the output kept
        must end where the text the parser held back begins, or after (what went out is never
        written again). The output kept is the tokens whose text ends there or before; the rest
        of the text up to the name (part of a token, or more) is written again, as the
        grammar's start."""
        text = "".join(text for text, _ in self._written)[: misnamed.at]
        kept, kept_text = self._kept_tokens(reply.output, text, misnamed.held_from)
        if kept < 0:
            return False
        again = text[len(kept_text) :]  # written again, before the name
        shapes = self._leading(
            renaming_targets(misnamed.name, self.tools),
            lambda name: again + json.dumps(name)[1:-1] + misnamed.after_name,
        )
        openings = self._openings() if self.choice.parallel else ()
        form = ToolCallForm(r"\s*\}", forced=shapes, openings=openings, forced_bare=True)
        grammar = await asyncio.to_thread(self._model.grammars.tool_calls, form)
        # The name is the model's text, which may carry the user's: debug level, as replies.
        log.debug("call renamed", extra={"tool": misnamed.name[:64], "kept": kept})
        await self._rewind(reply, kept, kept_text, grammar)
        return True

    def _kept_tokens(self, output: list[int], text: str, since: int) -> tuple[int, str]:
        """The most tokens of `output` whose text (as events gave it) is a prefix of `text` at
        least `since` characters long, checked by decoding them (a detokenizer may hold back a
        token's bytes), and that text; (-1, "") when none is."""
        bounds = [(0, "")]
        tokens, written = 0, ""
        for piece, count in self._written:
            tokens, written = tokens + count, written + piece
            if not text.startswith(written):
                break
            bounds.append((tokens, written))
        decode = self._model.tokenizer.decode
        for tokens, written in reversed(bounds):
            if len(written) < since:
                break
            if decode(output[:tokens], skip_special_tokens=False) == written:
                return tokens, written
        return -1, ""

    def _log_reply(self, written: str) -> None:
        """At debug level, what the model wrote (its markers put back) and how many calls were
        read from it: where a client saw text, this tells a call the parser missed from a call
        the model never made. The text is the user's: it is logged at debug level only."""
        if log.isEnabledFor(logging.DEBUG):
            shown = written[:LOGGED_REPLY_CHARS]
            log.debug(
                "reply",
                extra={"tools": len(self.tools), "calls": self._parser.calls, "text": shown},
            )

    def called(self, final: TokenEvent) -> bool:
        """Whether the reply ended by calling tools (`tool_use` / `tool_calls`): a call was
        made, and output did not run out of tokens in the middle of one."""
        cut = self._cut_short and final.finish_reason is FinishReason.LENGTH
        return self._parser.calls > 0 and not cut

    def _feed(self, text: str) -> list[ReplyEvent]:
        if self._reasoning is None:
            return list(self._parser.feed(text))
        return self._pieces(self._reasoning.feed(text))

    def _pieces(self, pieces: list[Piece]) -> list[ReplyEvent]:
        events: list[ReplyEvent] = []
        for piece in pieces:
            if piece.reasoning:
                events.append(ReasoningDelta(piece.text))
            else:
                events += self._parser.feed(piece.text)
        return events

    def _finish(self) -> list[ReplyEvent]:
        events = [] if self._reasoning is None else self._pieces(self._reasoning.finish())
        ended = self._parser.finish()
        self._cut_short = any(isinstance(event, CallEnd) for event in ended)
        return [*events, *ended]

    def _text_of(self, event: TokenEvent) -> str:
        """The event's text with the markers the detokenizer hid put back, when calls are
        parsed (a special token's own text is empty, so a marker goes after the text its token
        completed)."""
        if not self.active and self._reasoning is None:
            return event.text
        markers = [self._hidden[token] for token in event.token_ids if token in self._hidden]
        return event.text + "".join(markers)


class _Placeholders:
    """Optional arguments a small model made up, left out of its calls. It fills every
    property its tool's schema names, with what it has or a placeholder, which a client obeys
    or refuses where it would take the property left out: Claude Code answers a Read with
    `pages: ""` that pages are for PDF files only, and reads nothing at `limit: 0`; Codex cuts
    a command's output at `max_output_tokens: 1`; the Qwen2.5-Coder models then fail the task
    (docs/clients.md). So the arguments of a call to a tool that has optional properties are
    held until the call ends and then sent at once, without the optional strings given as
    `""`, or with `every_optional`, without any optional property (the model's calls then
    hold only their tools' required arguments: `tool_arguments = "required"`). A grammar
    cannot do this instead: held to the required properties, a model that means to go on to
    the next one writes a number's digits until its tokens run out. A call cut short goes as
    it came. Required properties, and every value kept, are the model's."""

    def __init__(self, schemas: Mapping[str, dict[str, Any]], every_optional: bool) -> None:
        self._optional = {
            name: _optional(schema, strings_only=not every_optional)
            for name, schema in schemas.items()
        }
        self._every = every_optional
        self._held: dict[int, tuple[frozenset[str], list[str]]] = {}  # by call index

    def dropped(self, events: list[ReplyEvent]) -> list[ReplyEvent]:
        out: list[ReplyEvent] = []
        for event in events:
            if isinstance(event, CallStart) and self._optional.get(event.name):
                self._held[event.index] = (self._optional[event.name], [])
            elif isinstance(event, ArgumentsDelta) and event.index in self._held:
                self._held[event.index][1].append(event.json)
                continue
            elif isinstance(event, CallEnd) and event.index in self._held:
                optional, pieces = self._held.pop(event.index)
                arguments = _without(optional, "".join(pieces), self._every)
                if arguments:
                    out.append(ArgumentsDelta(event.index, arguments))
            out.append(event)
        return out


def _optional(schema: object, strings_only: bool) -> frozenset[str]:
    """The top-level properties of `schema` (a client's: anything at all) that are not
    required (and are strings, with `strings_only`)."""
    if not isinstance(schema, dict) or not isinstance(schema.get("properties"), dict):
        return frozenset()
    listed = schema.get("required")
    required = (
        [name for name in listed if isinstance(name, str)] if isinstance(listed, list) else []
    )
    return frozenset(
        name
        for name, spec in schema["properties"].items()
        if name not in required
        and (not strings_only or (isinstance(spec, dict) and spec.get("type") == "string"))
    )


def _without(optional: frozenset[str], arguments: str, every: bool) -> str:
    """`arguments` (a call's JSON text) without the `optional` properties given as `""` (any
    of them, with `every`); as it came when it is no whole object or has none of them."""
    try:
        value = json.loads(arguments)
    except (ValueError, RecursionError):
        return arguments  # cut short (or nested past reading): the client gets what there is
    if not isinstance(value, dict):
        return arguments
    kept = {
        key: item for key, item in value.items() if not (key in optional and (every or item == ""))
    }
    return arguments if len(kept) == len(value) else json.dumps(kept, ensure_ascii=False)


def _free_text_grammar(fmt: type[ToolCallParser], model: ServedModel) -> bool:
    """Whether a grammar can hold the calls a model opens amid free text: its format opens a
    call with text (a trigger) that is no special token, and its reasoning, if it reasons,
    has none either (free text in a grammar holds no special token but the end)."""
    if fmt.TRIGGER is None or fmt.TRIGGER in hidden_markers(fmt, model.tokenizer).values():
        return False
    reasoning = reasoning_format(model.chat_template)
    return reasoning is None or not reasoning_markers(reasoning, model.tokenizer)


def _tokenless(event: TokenEvent) -> TokenEvent:
    """An event of the request a rename ended, as a reply's: it goes on, and these tokens are
    not its own."""
    return replace(event, token_ids=[], text="", finish_reason=None, usage=None, error=None)


def _through_first_call(events: list[ReplyEvent]) -> list[ReplyEvent]:
    end = next(i for i, event in enumerate(events) if isinstance(event, CallEnd))
    return events[: end + 1]


ReplyPart = str | ParsedCall | Reasoning


async def whole_reply(
    parsed: AsyncIterator[tuple[list[ReplyEvent], TokenEvent]],
) -> tuple[list[ReplyPart], TokenEvent]:
    """A non-streamed reply: its reasoning, text and calls in order, and the final engine
    event; an engine error raises."""
    parts: list[ReplyPart] = []
    async for events, event in parsed:
        if event.error is not None:
            raise event.error
        for tool_event in events:
            _add(parts, tool_event)
        if event.final:
            return parts, event
    raise RuntimeError("the engine ended a request without a final event")


def _add(parts: list[ReplyPart], event: ReplyEvent) -> None:
    last = parts[-1] if parts else None
    if isinstance(event, ReasoningDelta):
        if isinstance(last, Reasoning):
            last.text += event.text
        else:
            parts.append(Reasoning(event.text))
    elif isinstance(event, TextDelta):
        if isinstance(last, str):
            parts[-1] = last + event.text
        else:
            parts.append(event.text)
    elif isinstance(event, CallStart):
        parts.append(ParsedCall(event.name, ""))
    elif isinstance(event, ArgumentsDelta) and isinstance(last, ParsedCall):
        last.arguments += event.json
