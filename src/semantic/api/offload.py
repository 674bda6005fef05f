"""Where a request's own CPU work runs (its body parsed and bounded, its prompt rendered and
tokenized): a large request's on a worker thread, so that the event loop
keeps every other stream flowing meanwhile (a body of many MB takes a tenth of a second to
parse, a prompt of 18,000 tokens 30 ms to tokenize); a small request's inline, since the hop to
a thread and back costs more than the work. A hop wakes a worker, hands it the GIL and wakes
the loop again: a twentieth of a millisecond on a quiet core, but on a loaded one the woken
thread waits for a core, and four hops cost a short request milliseconds, where its work (a
~1,100-token chat request parsed, bounded, rendered and tokenized) takes about one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import ParamSpec, TypeVar

# A body this size renders to ~2,000 tokens at most of ordinary text: a few milliseconds of
# work at the most, which the loop may spend inline.
INLINE_BODY_BYTES = 8 * 1024

P = ParamSpec("P")
T = TypeVar("T")


async def run(body_bytes: int, work: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """`work(*args, **kwargs)` for a request whose body has `body_bytes` bytes: inline when
    that is at most `INLINE_BODY_BYTES`, else on a worker thread."""
    if body_bytes <= INLINE_BODY_BYTES:
        return work(*args, **kwargs)
    return await asyncio.to_thread(work, *args, **kwargs)
