"""A call's arguments written as tags, as Qwen3-Coder writes them, read as they stream:
`<parameter=KEY>\\nvalue\\n</parameter>`, repeated, then `</function>`. Values are text, typed by
the tool's JSON schema (`typed_value`); the arguments' JSON goes out as each parameter completes,
since a value's type is only known once it is whole.

The reader starts once the call has committed (`<function=NAME>` named an offered tool), so
nothing here turns back into plain text: what stands between parameters and is no tag is dropped,
and a closing tag the model left out is forgiven (`</function>` or `</tool_call>` also ends a
value, and the call). Tags are found by the few characters that may still start one, so a value
costs time linear in its length whatever it holds.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from typing import Any

from semantic.text import client_json
from semantic.text.tools import ArgumentsDelta, CallEnd, CallStart, Read, ToolEvent, marker_start

_PARAMETER = "<parameter="
_VALUE_END = "</parameter>"
_CALL_ENDS = ("</function>", "</tool_call>")
_BETWEEN_TAGS = (_PARAMETER, *_CALL_ENDS)
_VALUE_TAGS = (_VALUE_END, *_CALL_ENDS)
_MAX_KEY_CHARS = 256  # a parameter name longer than this is not one


class XmlArgumentsReader:
    """The arguments of call `index` to `name`, whose argument schema is `schema`. It emits the
    call's start and `{` at once (the call has committed), then `"key": value` as each parameter
    ends, then `}` and the call's end."""

    def __init__(self, index: int, name: str, schema: Mapping[str, Any] | None) -> None:
        self.index = index
        self.text: list[str] = []  # never plain text again: the call has committed
        self.events: list[ToolEvent] = [CallStart(index, name), ArgumentsDelta(index, "{")]
        self._properties = _properties(schema)
        self._step: Callable[[str], None] = self._between
        self._held = ""  # what may be the start of a tag, shorter than one
        self._key: list[str] = []
        self._value: list[str] = []
        self._written = 0  # parameters emitted
        self._done = False

    def push(self, char: str) -> Read:
        self._step(char)
        return Read.DONE if self._done else Read.MORE

    def finish(self) -> bool:
        """The output ended inside the call: a value being written is taken as far as it came,
        and the arguments are left open, as a JSON call cut short leaves them."""
        if self._step == self._in_value:
            self._value.append(self._held)
            self._add_parameter()
        self.events.append(CallEnd(self.index))
        return True

    def _between(self, char: str) -> None:
        """Before a parameter: its `<parameter=`, or the call's end."""
        tail = self._held + char
        self._held = ""
        if tail.endswith(_PARAMETER):
            self._key = []
            self._step = self._in_key
        elif tail.endswith(_CALL_ENDS):
            self._end_call()
        else:
            self._held = tail[len(tail) - marker_start(tail, _BETWEEN_TAGS) :]

    def _in_key(self, char: str) -> None:
        """The parameter's name, up to `>`; one that cannot be a name is dropped."""
        if char == ">" and "".join(self._key).strip():
            self._value = []
            self._step = self._in_value
        elif char in "<>\n" or len(self._key) >= _MAX_KEY_CHARS:
            self._step = self._between
            self._between(char)
        else:
            self._key.append(char)

    def _in_value(self, char: str) -> None:
        if char != "<" and not self._held:  # every tag starts with `<`: the common case, fast
            self._value.append(char)
            return
        tail = self._held + char
        self._held = ""
        end = next((tag for tag in _VALUE_TAGS if tail.endswith(tag)), None)
        if end is None:
            keep = marker_start(tail, _VALUE_TAGS)
            self._value.append(tail[: len(tail) - keep])
            self._held = tail[len(tail) - keep :]
            return
        self._value.append(tail.removesuffix(end))
        self._add_parameter()
        self._step = self._between
        if end in _CALL_ENDS:
            self._end_call()

    def _add_parameter(self) -> None:
        key = "".join(self._key).strip()
        # The template writes a newline after the opening tag and before the closing one.
        text = "".join(self._value).removeprefix("\n").removesuffix("\n")
        value = typed_value(text, self._properties.get(key))
        separator = ", " if self._written else ""
        pair = f"{separator}{json.dumps(key, ensure_ascii=False)}: {value}"
        self.events.append(ArgumentsDelta(self.index, pair))
        self._written += 1

    def _end_call(self) -> None:
        self.events += [ArgumentsDelta(self.index, "}"), CallEnd(self.index)]
        self._done = True


def typed_value(text: str, schema: Any) -> str:
    """The JSON of a parameter's value, written as `text`: of the first type its schema gives
    (`type`, or the types of `anyOf` / `oneOf`) that `text` converts to, a string always
    converting; a JSON string when none does, or the schema gives no type."""
    for kind in _types(schema):
        if kind == "string":
            break
        converted = _CONVERSIONS.get(kind, _no_conversion)(text.strip())
        if converted is not None:
            return converted
    return json.dumps(text, ensure_ascii=False)


def _properties(schema: Mapping[str, Any] | None) -> Mapping[str, Any]:
    properties = schema.get("properties") if isinstance(schema, Mapping) else None
    return properties if isinstance(properties, Mapping) else {}


def _types(schema: Any) -> list[str]:
    if not isinstance(schema, Mapping):
        return []
    kinds = schema.get("type")
    found = [kinds] if isinstance(kinds, str) else list(kinds) if isinstance(kinds, list) else []
    for variants in (schema.get("anyOf"), schema.get("oneOf")):
        for variant in variants if isinstance(variants, list) else []:
            found += _types(variant)
    return [kind for kind in found if isinstance(kind, str)]


def _json_of(kinds: tuple[type, ...]) -> Callable[[str], str | None]:
    """A conversion of text that is JSON of one of these Python types (a bool is no number)."""

    def convert(text: str) -> str | None:
        try:
            value = client_json.loads(text)
        except client_json.NotJson:
            return None
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
            return None
        if isinstance(value, float) and not math.isfinite(value):
            return None  # NaN, Infinity and 1e999, which JSON cannot carry
        return json.dumps(value, ensure_ascii=False)

    return convert


def _boolean(text: str) -> str | None:
    # Either case: the template writes a boolean back as Python does (`True`).
    return text.lower() if text.lower() in ("true", "false") else None


def _null(text: str) -> str | None:
    return "null" if text == "null" else None


def _no_conversion(text: str) -> str | None:
    return None


_CONVERSIONS: dict[str, Callable[[str], str | None]] = {
    "integer": _json_of((int,)),
    "number": _json_of((int, float)),
    "boolean": _boolean,
    "null": _null,
    "object": _json_of((dict,)),
    "array": _json_of((list,)),
}
