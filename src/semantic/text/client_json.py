"""JSON from clients (request bodies, tool-call arguments in a history), parsed with its nesting
bounded, so that nothing a client sends can make a consumer downstream recurse out of stack.

`json.loads` itself raises RecursionError near Python's recursion limit (1000 frames, C and
Python together), and what it does take can still be too deep for what recurses over it later
with more frames below it: a chat template's `tojson`, a template macro that walks a tool's
schema (several frames a level), the manifest writer. A value nested at most `MAX_DEPTH` deep
leaves all of them room; no real schema or tool argument comes near it.
"""

from __future__ import annotations

import json
from typing import Any

MAX_DEPTH = 128  # arrays and objects within one another, the outermost counted


class NotJson(ValueError):
    """The text is not JSON, or nests deeper than `MAX_DEPTH`; the message says which, worded
    to follow the name of what was parsed ("the request body is not valid JSON")."""


def loads(data: str | bytes) -> Any:
    """The value `data` holds. NotJson when it is not valid JSON (invalid UTF-8 included) or
    nests deeper than `MAX_DEPTH`. Time linear in the text."""
    try:
        value = json.loads(data)
    except RecursionError:
        raise NotJson(_TOO_DEEP) from None
    except ValueError:  # JSONDecodeError, UnicodeDecodeError
        raise NotJson("is not valid JSON") from None
    if nesting_exceeds(value, MAX_DEPTH):
        raise NotJson(_TOO_DEEP)
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
