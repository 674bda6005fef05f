"""JSON read one character at a time: whether the text so far can still become valid JSON, and
where the members of the top-level object begin and end.

Tool calls stream: their argument JSON goes to the client in fragments while the model writes
it, so a call must be recognised as broken at the character that breaks it, not after the
fact. `json` only judges whole texts, and partial-JSON parsers (jiter's partial mode) forgive
trailing garbage, so this is a small grammar automaton (RFC 8259) over the characters instead.
"""

from __future__ import annotations

import json
from typing import Literal

_WHITESPACE = frozenset(" \t\n\r")
_DIGITS = frozenset("0123456789")
_HEX = frozenset("0123456789abcdefABCDEF")
_ESCAPES = frozenset('"\\/bfnrtu')
_LITERALS = {"t": "true", "f": "false", "n": "null"}
# A number's states (`-?(0|[1-9]\d*)(\.\d+)?([eE][+-]?\d+)?`); it may end in these.
_NUMBER_ENDS = frozenset({"zero", "int", "frac", "exp"})

Expect = Literal["value", "value_or_close", "key", "key_or_close", "colon", "comma_or_close", "end"]


def _number_step(state: str, char: str) -> str | None:
    """The number state after `char`, or None when `char` cannot continue the number."""
    digit = char in _DIGITS
    if state == "minus":
        return "zero" if char == "0" else "int" if digit else None
    if state in ("zero", "int"):
        if state == "int" and digit:
            return "int"
        return "dot" if char == "." else "exp_mark" if char in "eE" else None
    if state in ("dot", "frac"):
        if digit:
            return "frac"
        return "exp_mark" if state == "frac" and char in "eE" else None
    if state == "exp_mark" and char in "+-":
        return "exp_sign"
    return "exp" if digit else None  # exp_mark, exp_sign, exp


class JsonPrefix:
    """A JSON text fed one character at a time.

    `push` answers whether the text still is a prefix of some valid JSON text; after a refusal
    the reader is spent (its state is not rolled back). For the top-level object it reports,
    per push, the key whose value this character began (`started`) or ended (`ended`, with the
    end offset in `ended_at`: a number ends at the character after it, which is not its own).
    Offsets count the characters accepted so far.
    """

    def __init__(self) -> None:
        self.length = 0
        self.started: str | None = None
        self.ended: str | None = None
        self.ended_at = 0
        self._stack: list[str] = []  # the open containers, "{" or "["
        self._expect: Expect = "value"
        self._token: Literal["string", "key", "number", "literal"] | None = None
        self._number = ""  # the number's state while reading one
        self._literal = ""  # the rest of `true`, `false` or `null` still to come
        self._escape = 0  # 0: none; -1: after a backslash; n > 0: hex digits still due
        self._key_chars: list[str] = []  # the raw key being read at the top level
        self._key: str | None = None  # the top-level key whose value comes or is being read

    @property
    def complete(self) -> bool:
        """A whole value has been read (trailing whitespace may still follow)."""
        return self._expect == "end"

    @property
    def depth(self) -> int:
        return len(self._stack)

    def push(self, char: str) -> bool:
        self.started = self.ended = None
        accepted = self._read(char)
        if accepted:
            self.length += 1
        return accepted

    def _read(self, char: str) -> bool:
        if self._token in ("string", "key"):
            return self._read_string(char)
        if self._token == "literal":
            if char != self._literal[0]:
                return False
            self._literal = self._literal[1:]
            if not self._literal:
                self._token = None
                self._value_done(self.length + 1)
            return True
        if self._token == "number":
            state = _number_step(self._number, char)
            if state is not None:
                self._number = state
                return True
            if self._number not in _NUMBER_ENDS:
                return False
            self._token = None
            self._value_done(self.length)  # the number ends before this character
        return self._read_structure(char)

    def _read_string(self, char: str) -> bool:
        if self._escape:
            if self._escape < 0:
                if char not in _ESCAPES:
                    return False
                self._escape = 4 if char == "u" else 0
            elif char in _HEX:
                self._escape -= 1
            else:
                return False
        elif char == "\\":
            self._escape = -1
        elif char < " ":
            return False  # control characters must be escaped
        elif char == '"':
            return self._string_done()
        if self._token == "key" and self._at_top_object():
            self._key_chars.append(char)
        return True

    def _string_done(self) -> bool:
        if self._token == "key":
            if self._at_top_object():
                self._key = json.loads('"' + "".join(self._key_chars) + '"')
                self._key_chars.clear()
            self._token, self._expect = None, "colon"
        else:
            self._token = None
            self._value_done(self.length + 1)
        return True

    def _read_structure(self, char: str) -> bool:
        if char in _WHITESPACE:
            return True
        expect = self._expect
        if expect in ("value", "value_or_close"):
            if char == "]" and expect == "value_or_close":
                return self._close("[")
            return self._begin_value(char)
        if expect in ("key", "key_or_close"):
            if char == "}" and expect == "key_or_close":
                return self._close("{")
            if char != '"':
                return False
            self._token = "key"
            return True
        if expect == "colon":
            if char != ":":
                return False
            self._expect = "value"
            return True
        if expect == "comma_or_close":
            if char == ",":
                self._expect = "key" if self._stack[-1] == "{" else "value"
                return True
            return char in "}]" and self._close("{" if char == "}" else "[")
        return False  # "end": only whitespace may follow a whole value

    def _begin_value(self, char: str) -> bool:
        if self._at_top_object():
            self.started = self._key
        if char == '"':
            self._token = "string"
        elif char in "{[":
            self._stack.append(char)
            self._expect = "key_or_close" if char == "{" else "value_or_close"
        elif char == "-" or char in _DIGITS:
            self._token = "number"
            self._number = "minus" if char == "-" else _number_step("minus", char) or ""
        elif char in _LITERALS:
            self._token, self._literal = "literal", _LITERALS[char][1:]
        else:
            self.started = None
            return False
        return True

    def _close(self, opener: str) -> bool:
        if self._stack[-1] != opener:
            return False
        self._stack.pop()
        self._value_done(self.length + 1)
        return True

    def _value_done(self, end: int) -> None:
        """A value ended at offset `end`: a member of the top-level object, when that is where
        it sat."""
        if not self._stack:
            self._expect = "end"
            return
        self._expect = "comma_or_close"
        if self._at_top_object():
            self.ended, self.ended_at = self._key, end

    def _at_top_object(self) -> bool:
        return self._stack == ["{"]
