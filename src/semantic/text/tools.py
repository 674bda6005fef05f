"""Tool calls in a model's output, parsed while it streams: the machinery every family's parser
shares (tool_formats.py has the families).

A parser is fed the output's text deltas and returns events: plain text, a call's start (its
name), its argument JSON in fragments, a call's end. Text is held back only while it may be the
start of a call marker (and whitespace, which is dropped next to a call). A call streams once it
is certain enough: its name is a tool that was offered and its arguments have opened as a JSON
object. Before that, text that breaks the JSON or names another tool turns back into plain
text; after it, a break ends the call where the JSON stopped being valid (as running out of
tokens does), and the rest is text again. A format whose arguments are no JSON object reads
its calls with a reader of its own (a `CallReader`).

The families, and how one is picked for a model: tool_formats.py.
"""

from __future__ import annotations

import enum
import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from semantic.text.json_prefix import JsonPrefix


@dataclass(slots=True, frozen=True)
class TextDelta:
    text: str


@dataclass(slots=True, frozen=True)
class CallStart:
    index: int  # the call's position among this output's calls
    name: str


@dataclass(slots=True, frozen=True)
class ArgumentsDelta:
    """A fragment of the call's arguments: all of them in order are its JSON object."""

    index: int
    json: str


@dataclass(slots=True, frozen=True)
class CallEnd:
    index: int


ToolEvent = TextDelta | CallStart | ArgumentsDelta | CallEnd

WHITESPACE = " \t\n\r"
_ARGUMENT_KEYS = ("arguments", "parameters")


class Read(enum.Enum):
    """What a character did to the call being read."""

    MORE = enum.auto()  # the character belongs to the call, which goes on
    DONE = enum.auto()  # the character ended the call
    REJECTED = enum.auto()  # not a call after all: its text is plain text (not this character)
    MISNAMED = enum.auto()  # a call of a tool not offered: its arguments begin at this character
    BROKEN = enum.auto()  # a streaming call ended before this character, which is not its own


@dataclass(slots=True, frozen=True)
class MisnamedCall:
    """A call the model began of a tool that was not offered: `{"name": "made_up",
    "arguments": {` (or any other value), the arguments just begun. `at`: where the name's text
    begins in what the parser was fed; `after_name`: what came between the name's text and the
    arguments, as the model spaced it (the closing quote, the key, the colon); `held_from`:
    where the text the parser holds back begins (the call's `{`, or a fence or whitespace
    before it): none of it has been given out."""

    name: str
    at: int
    after_name: str
    held_from: int = 0


def renaming_targets(made_up: str, offered: Sequence[str]) -> list[str]:
    """The offered tools a call of the tool `made_up` may be written again as: all but those
    that begin with the made-up name's first word and then part from it, each name having a
    word the other lacks (`create_goal` for `create_file`, `write_stdin` for `write_file`).
    Held to the offered names, the model writes again the word it began the made-up name with,
    and the grammar would finish it as that other tool, whatever the model meant. A name that
    only adds words or drops them stays (`Read` for `read_file`, `read_file` for `read`).
    Where that leaves none, all of them."""
    words = _name_words(made_up)
    mine = set(words)

    def parts(name: str) -> bool:
        theirs = _name_words(name)
        other = set(theirs)
        return theirs[:1] == words[:1] and bool(mine - other) and bool(other - mine)

    return [name for name in offered if not parts(name)] or list(offered)


def _name_words(name: str) -> list[str]:
    """A tool name's words, lower case and singular: `list_files`, `ListFiles` and `list-file`
    all give list, file."""
    words = re.findall(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+", name)
    return [word.lower().removesuffix("s") if len(word) > 3 else word.lower() for word in words]


class CallReader(Protocol):
    """One call being read, a character at a time. `text` is what it read (plain text again if
    the call is rejected), `events` what it made since the parser last took them."""

    text: list[str]
    events: list[ToolEvent]

    def push(self, char: str) -> Read: ...

    def finish(self) -> bool:
        """The output ended inside the call: True when it was a call (it ends), False when
        its text is plain text."""
        ...


class _CallReader:
    """One call's JSON, a character at a time: `{"name": …, "arguments": {…}}`, or with `name`
    given, the arguments object alone. Nothing is emitted before the call commits (its name is
    offered and its arguments opened as an object); until then the reader may reject it."""

    def __init__(
        self,
        index: int,
        offered: frozenset[str],
        name: str | None = None,
        needs_arguments: bool = False,
        renaming: bool = False,
    ) -> None:
        self.index = index
        self.text: list[str] = []  # the characters read
        self.events: list[ToolEvent] = []
        self.committed = False
        self._offered = offered
        self._json = JsonPrefix()
        self._bare = name is not None  # the text is the arguments object itself
        # A call without the family's marker (a small model's bare JSON) must say `arguments`:
        # an object that merely has a tool's name is an answer's JSON, not a call.
        self._needs_arguments = needs_arguments
        self._name = name
        # Whether a call of a tool not offered is told from text (`MISNAMED`) rather than
        # rejected at its name: it is, once its arguments begin.
        self._renaming = renaming
        self.misnamed: MisnamedCall | None = None  # its name (`at` counts from the `{`)
        self._unknown: str | None = None  # a name not offered, while its arguments may follow
        self._name_end = 0  # where that name's closing quote is in `text`
        self._name_start: int | None = None
        self._args_start: int | None = None
        self._args_end: int | None = None
        self._sent = 0  # arguments are emitted up to this offset

    def push(self, char: str) -> Read:
        if not self._json.push(char):
            return self._break()
        if self._unknown is not None:
            return self._misnamed(char)
        if not self._keeps_a_call(char):
            return Read.REJECTED
        self.text.append(char)
        if self._json.ended in _ARGUMENT_KEYS or (self._bare and self._json.complete):
            self._args_end = self._args_end or len(self.text)
        if not self.committed and self._name is not None and self._args_start is not None:
            self._commit()
        self._send_arguments()
        if not self._json.complete:
            return Read.MORE
        if not self.committed:
            self._commit(arguments="{}")  # a call with no arguments at all
        self.events.append(CallEnd(self.index))
        return Read.DONE

    def finish(self) -> bool:
        """The output ended inside this call: end it if it was streaming (its arguments as far
        as they came); False when it never committed, and so is plain text."""
        if self.committed:
            self.events.append(CallEnd(self.index))
        return self.committed

    def _keeps_a_call(self, char: str) -> bool:
        """Whether the text with `char` (valid JSON so far) may still be a call: the name is a
        string naming an offered tool, the arguments an object, and a whole object has a name.
        Notes where the name and the arguments begin, and the name once it ends."""
        if not self._note(char, len(self.text)):
            return False
        if self._json.ended == "name" and self._name is None:
            assert self._name_start is not None
            name = json.loads("".join(self.text[self._name_start :]) + char)
            if name not in self._offered:
                self._unknown = name if self._renaming else None
                self._name_end = len(self.text)  # where this character, its closing quote, goes
                return self._renaming
            self._name = name
        if not self._json.complete:
            return True
        return self._name is not None and (
            self._args_start is not None or not self._needs_arguments
        )

    def _misnamed(self, char: str) -> Read:
        """After the name of a tool not offered: a call of it once its arguments begin, of
        whatever type (small models write `"arguments": "42"` or `["ls"]` for a tool they made
        up as readily as an object: written again, they become an object); another key, or
        the object's end, makes it an answer's JSON."""
        started = self._json.started
        if started is None and not self._json.complete:
            self.text.append(char)
            return Read.MORE
        if started not in _ARGUMENT_KEYS:
            return Read.REJECTED
        assert self._unknown is not None and self._name_start is not None
        after_name = "".join(self.text[self._name_end :])
        self.misnamed = MisnamedCall(self._unknown, self._name_start + 1, after_name)
        return Read.MISNAMED

    def _note(self, char: str, offset: int) -> bool:
        """Where the name and the arguments begin; False when either is of the wrong type."""
        if self._bare:
            if self._args_start is None and char not in WHITESPACE:
                self._args_start = offset
                return char == "{"
            return True
        started = self._json.started
        if started == "name" and self._name_start is None:
            self._name_start = offset
            return char == '"'
        if started in _ARGUMENT_KEYS and self._args_start is None:
            self._args_start = offset
            return char == "{"
        return True

    def _commit(self, arguments: str = "") -> None:
        assert self._name is not None
        self.committed = True
        self.events.append(CallStart(self.index, self._name))
        if arguments:
            self.events.append(ArgumentsDelta(self.index, arguments))
        self._sent = self._args_start or 0

    def _send_arguments(self) -> None:
        if not self.committed or self._args_start is None:
            return
        end = len(self.text) if self._args_end is None else self._args_end
        if end > self._sent:
            self.events.append(ArgumentsDelta(self.index, "".join(self.text[self._sent : end])))
            self._sent = end

    def _break(self) -> Read:
        if not self.committed:
            return Read.REJECTED
        self.events.append(CallEnd(self.index))
        return Read.BROKEN


class ToolCallParser:
    """Finds a family's call markers in the text and hands what follows to a `_CallReader`.

    Subclasses name their `MARKERS` (the strings that open a call, plus any the format writes
    as special tokens) and say what follows a marker (`_on_marker`). `opener` is the text a
    reply forced to call a tool starts with (prefilled by the server, then fed here too);
    `CLOSER` what ends a call after its arguments object, and `TRIGGER` the text that opens a
    call anywhere in a reply (None where a call is told from text by its place): the grammar
    of a call held to its tool's schema is built from them, where `JSON_ARGUMENTS` says the
    arguments are a JSON object. `schemas` holds the offered tools' argument schemas by name,
    for a format that writes values as text and types them by the schema.

    With `renaming` set, a JSON call of a tool that was not offered is not turned back into
    text at its name: once its arguments open, the parser stops there, holding it, and says so
    in `misnamed` (the reply can then be written again from the name on, held to the offered
    tools: api/tool_use.py). Likewise a reply that opens with one of `MADE_UP`, the tags the
    family's template puts text in that the assistant's turn never holds: a tool's result (the
    model wrote what a call would have answered instead of making it) or the tools' definitions
    (it wrote its prompt back). `skipped` says where the text held back begins (the reply can
    be written again from there as a call). Fed nothing more, `finish` makes either text after
    all."""

    MARKERS: tuple[str, ...] = ()
    CLOSER = ""
    TRIGGER: str | None = None
    MADE_UP: tuple[str, ...] = ()
    JSON_ARGUMENTS = True
    SEPARATORS = WHITESPACE  # what may sit between calls, dropped

    def __init__(
        self, tools: Iterable[str], schemas: Mapping[str, dict[str, Any]] | None = None
    ) -> None:
        self._offered = frozenset(tools)
        self._schemas = dict(schemas or {})
        self._events: list[ToolEvent] = []
        # Text not yet emitted: whitespace (dropped if a call follows), then a possible marker
        # start. Pieces in lists, joined once when they go: appending to a string held in an
        # attribute copies it, which made a long run of whitespace cost its length squared.
        self._space: list[str] = []
        self._partial = ""  # never whitespace (no marker holds any), shorter than a marker
        self._call_text: list[str] = []  # the call being read, as far as its reader lacks it
        self._reader: CallReader | None = None
        self._step: Callable[[str], None] = self._text
        self.calls = 0  # calls ended so far
        self._after_call = False  # nothing but separators since the last call
        self._spoke = False  # some text was emitted
        self.renaming = False
        self.misnamed: MisnamedCall | None = None
        self.skipped: int | None = None  # where the held made-up text begins
        self._fed = 0  # characters fed so far

    @classmethod
    def opener(cls, name: str | None) -> str:
        """The start of a reply that calls `name` (any offered tool when None)."""
        raise NotImplementedError

    @classmethod
    def bare_opener(cls, name: str) -> str | None:
        """A regular expression for the start of a call of `name` written without the family's
        marker, up to where its arguments begin, where the family reads such calls (a small
        model's bare JSON); None where it does not."""
        return None

    def feed(self, text: str) -> list[ToolEvent]:
        for char in text:
            self._fed += 1
            self._step(char)
        return self._drain()

    def finish(self) -> list[ToolEvent]:
        """The output ended: a streaming call ends, everything held back is text."""
        reader, self._reader = self._reader, None
        if reader is not None and reader.finish():
            self._events.extend(reader.events)
            self.calls += 1
        else:
            self._emit("".join(self._call_text) + "".join(reader.text if reader else []))
        self._emit("".join(self._space) + self._partial)
        self._call_text, self._space, self._partial = [], [], ""
        self._step = self._text
        return self._drain()

    # -- text between calls -----------------------------------------------------------------

    def _markers(self) -> tuple[str, ...]:
        """The markers that open a call here (some families only allow a call in places)."""
        return self.MARKERS

    def _text(self, char: str) -> None:
        # A marker holds no whitespace, so one that ends here, or starts and is not over yet,
        # lies within the held marker start and this character.
        tail = self._partial + char
        markers = self._markers() + self._made_up_markers()
        marker = next((m for m in markers if tail.endswith(m)), None)
        if marker is not None:
            self._hold(tail[: len(tail) - len(marker)])
            self._call_text, self._space, self._partial = self._space, [], ""
            if marker in self.MADE_UP:
                self._skip_call(marker)
            else:
                self._on_marker(marker)
            return
        keep = marker_start(tail, markers)
        self._hold(tail[: len(tail) - keep])
        self._partial = tail[len(tail) - keep :]

    def _made_up_markers(self) -> tuple[str, ...]:
        """`MADE_UP`, where it would open the reply: nothing but whitespace before it."""
        opens = self.renaming and not self._spoke and self.calls == 0
        return self.MADE_UP if opens else ()

    def _skip_call(self, marker: str) -> None:
        """The reply opened with made-up text (a result, the tools' definitions): hold it, and
        everything after it, until `release` (or `finish`, as text)."""
        self._call_text.append(marker)
        self.skipped = self._fed - len("".join(self._call_text))
        self._step = self._call_text.append

    def _hold(self, text: str) -> None:
        """Emit the held whitespace and `text`, but for the whitespace that ends it, which is
        held instead (dropped if a call follows)."""
        words = text.rstrip(WHITESPACE)
        if not words:
            if text:
                self._space.append(text)
            return
        self._emit("".join(self._space) + words)
        self._space = [text[len(words) :]]

    def _emit(self, text: str) -> None:
        if self._after_call:
            text = text.lstrip(self.SEPARATORS)
        if text:
            self._after_call = False
            self._spoke = self._spoke or bool(text.strip())
            self._events.append(TextDelta(text))

    def _on_marker(self, marker: str) -> None:
        """A marker opened a call: by default a JSON call object follows."""
        self._call_text.append(marker)
        self._step = self._call_object

    # -- calls -------------------------------------------------------------------------------

    def _call_object(self, char: str) -> None:
        """Before a call object: whitespace, then its `{`."""
        if char in WHITESPACE:
            self._call_text.append(char)
        elif char == "{":
            self._read_call(char)
        else:
            self._reject(char)

    def _read_call(self, char: str, name: str | None = None, bare: bool = False) -> None:
        """A call's JSON from `char` on; `bare`: written without the family's marker."""
        reader = _CallReader(self.calls, self._offered, name, bare, self.renaming)
        self._read_with(reader, char)

    def _read_with(self, reader: CallReader, char: str | None = None) -> None:
        """Hand the call to `reader`, from `char` on (from the next one when None)."""
        self._reader = reader
        self._step = self._in_call
        if char is not None:
            self._in_call(char)
        else:
            self._events.extend(reader.events)
            reader.events.clear()

    def _in_call(self, char: str) -> None:
        assert self._reader is not None
        read = self._reader.push(char)
        self._events.extend(self._reader.events)
        self._reader.events.clear()
        if read is Read.REJECTED:
            self._reject(char)
        elif read is Read.MISNAMED:
            assert isinstance(self._reader, _CallReader) and self._reader.misnamed is not None
            misnamed, reader = self._reader.misnamed, self._reader
            # `at` counted from the call's `{`, which is `len(reader.text)` characters back
            start = self._fed - 1 - len(reader.text)
            held_from = start - len("".join(self._call_text))
            self.misnamed = replace(misnamed, at=start + misnamed.at, held_from=held_from)
            reader.text.append(char)
            self._step = reader.text.append  # held until `release`, or `finish` (as text)
        elif read is not Read.MORE:
            self._reader = None
            self._call_text = []
            self.calls += 1
            self._after_call = True
            self._step = self._after_call_step()
            if read is Read.BROKEN:
                self._step(char)

    def release(self) -> list[ToolEvent]:
        """Read the call `misnamed` names, or the result `skipped` begins, as text after all,
        and go on."""
        self.misnamed = self.skipped = None
        self._reject(None)
        return self._drain()

    def _after_call_step(self) -> Callable[[str], None]:
        """Where a finished call leaves the parser (a Mistral list goes on to its next item)."""
        return self._text

    def _reject(self, char: str | None) -> None:
        """Not a call: its text so far is plain text, and `char` is read again as text."""
        reader, self._reader = self._reader, None
        text = "".join(self._call_text) + "".join(reader.text if reader else [])
        self._call_text = []
        self._step = self._text
        self._emit(text)
        if char is not None:
            self._text(char)

    def _drain(self) -> list[ToolEvent]:
        """The events since the last drain, adjacent text and argument fragments merged."""
        merged: list[ToolEvent] = []
        for event in self._events:
            last = merged[-1] if merged else None
            if isinstance(event, TextDelta) and isinstance(last, TextDelta):
                merged[-1] = TextDelta(last.text + event.text)
            elif (
                isinstance(event, ArgumentsDelta)
                and isinstance(last, ArgumentsDelta)
                and last.index == event.index
            ):
                merged[-1] = ArgumentsDelta(event.index, last.json + event.json)
            else:
                merged.append(event)
        self._events = []
        return merged


def marker_start(text: str, markers: Sequence[str]) -> int:
    """The length of the longest tail of `text` that one of `markers` starts with (short of the
    whole marker): what must be held back, as it may be a marker's start."""
    if any(len(text) < len(marker) and marker.startswith(text) for marker in markers):
        return len(text)  # all of it, the usual case when a marker's start was held already
    longest = 0
    for marker in markers:
        for size in range(min(len(marker) - 1, len(text)), longest, -1):
            if text.endswith(marker[:size]):
                longest = size
                break
    return longest


class PlainText:
    """The parser for output that is not searched for calls (`tool_choice` none, no tools)."""

    calls = 0
    misnamed: MisnamedCall | None = None  # never: no call is read
    skipped: int | None = None

    def feed(self, text: str) -> list[ToolEvent]:
        return [TextDelta(text)] if text else []

    def release(self) -> list[ToolEvent]:
        return []

    def finish(self) -> list[ToolEvent]:
        return []
