"""JSON from clients (request bodies, tool-call arguments in a history), parsed with its nesting
bounded, so that nothing a client sends can make a consumer downstream recurse out of stack, and
with its lone surrogates mended, so that every string in it is text that UTF-8 can hold.

`json.loads` itself raises RecursionError near Python's recursion limit (1000 frames, C and
Python together), and what it does take can still be too deep for what recurses over it later
with more frames below it: a chat template's `tojson`, a template macro that walks a tool's
schema (several frames a level), the manifest writer. A value nested at most `MAX_DEPTH` deep
leaves all of them room; no real schema or tool argument comes near it.

A JSON string may hold half of a UTF-16 surrogate pair (`"\\ud83d"`: a JavaScript string cut
mid-emoji, as clients cut long tool output). Python keeps it as a lone surrogate, which no
tokenizer takes and no UTF-8 file or response can hold; each becomes U+FFFD, the replacement
character, as a UTF-8 decoder writes for bytes it cannot read.
"""

from __future__ import annotations

import json
import re
from typing import Any

MAX_DEPTH = 128  # arrays and objects within one another, the outermost counted
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")
# An escaped surrogate, half of a pair or lone: which it is shows only once parsed.
_ESCAPED_SURROGATE = re.compile(r"\\u[dD][89a-fA-F]")


class NotJson(ValueError):
    """The text is not JSON, or nests deeper than `MAX_DEPTH`; the message says which, worded
    to follow the name of what was parsed ("the request body is not valid JSON")."""


def loads(data: str | bytes) -> Any:
    """The value `data` holds, its lone surrogates mended. NotJson when it is not valid JSON
    (invalid UTF-8 included) or nests deeper than `MAX_DEPTH`. Time linear in the text."""
    try:
        value = json.loads(text := _decoded(data))
    except RecursionError:
        raise NotJson(_TOO_DEEP) from None
    except ValueError:  # JSONDecodeError, UnicodeDecodeError
        raise NotJson("is not valid JSON") from None
    if nesting_exceeds(value, MAX_DEPTH):
        raise NotJson(_TOO_DEEP)
    return _mended(value) if _may_hold_surrogates(text) else value


def _decoded(data: str | bytes) -> str:
    """The text of `data`, read as `json.loads` reads bytes (lone surrogates let through)."""
    if isinstance(data, str):
        return data
    return data.decode(json.detect_encoding(data), "surrogatepass")


def _may_hold_surrogates(text: str) -> bool:
    """Whether `text`, parsed, may hold a lone surrogate: it escapes a surrogate, or holds one.
    (A regex that looks for both at once reads 9.5 MB in 0.2 s, holding the GIL; these two
    checks take 10 ms.)"""
    return _ESCAPED_SURROGATE.search(text) is not None or not _is_utf8(text)


def mend_surrogates(text: str) -> str:
    """`text` with each lone surrogate replaced by U+FFFD."""
    return text if _is_utf8(text) else _LONE_SURROGATE.sub("\ufffd", text)


def _is_utf8(text: str) -> bool:
    """Whether UTF-8 can hold `text`: whether it holds no surrogate. Encoding is C at memory
    speed, where a regex over a long prompt takes a tenth of a second."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def _mended(value: Any) -> Any:
    """`value` with every string in it (object keys too) mended. Recursive, but only over what
    `nesting_exceeds` has let through."""
    if isinstance(value, str):
        return mend_surrogates(value)
    if isinstance(value, list):
        return [_mended(item) for item in value]
    if isinstance(value, dict):
        return {mend_surrogates(key): _mended(item) for key, item in value.items()}
    return value


def nesting_exceeds(value: Any, limit: int) -> bool:
    """Whether arrays and objects nest more than `limit` deep in `value`: level by level, with
    no recursion, each container visited once."""
    level = [value]
    for _ in range(limit):
        level = [
            child
            for item in level
            if isinstance(item, (dict, list))
            for child in (item.values() if isinstance(item, dict) else item)
        ]
        if not level:
            return False
    return any(isinstance(item, (dict, list)) for item in level)


_TOO_DEEP = f"nests arrays and objects deeper than {MAX_DEPTH} levels"
