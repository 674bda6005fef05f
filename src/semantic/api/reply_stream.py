"""One reply's stream of engine events, which the reply can stop, and take back to a point of its
own output to go on from there under another grammar.

A small model sometimes begins a call of a tool that was not offered, `{"name": "write_file",
"arguments": {…}}`, where the request offers `Write`; as text, the agent never sees a call. A
grammar holds a call to the offered tools from where it can tell a call begins, but this one
showed it was a call only at its `arguments`, after its name was written. So the reply is taken
back to where the name began and written again from there, the name and arguments held to the
offered tools by a grammar: the model picks the offered tool it finds likeliest and writes
its arguments (api/tool_use.py decides when; this module does it).

Going back is a new engine request: the prompt and the output kept, as one prompt, which the
cache serves (the stopped request's output included: its KV stays). The client sees one reply:
the text the parser held back from the call's `{` on was never sent, and the usage counts the
first request's prompt and cache, and the output kept plus what came after it.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import replace

from semantic.api.streaming import close_iterator
from semantic.core import OutputGrammar, Request, TokenEvent, Usage
from semantic.engine.port import EnginePort

# Times one reply may be taken back, each a request. A call written again is held to the offered
# tools, so only a later call can be taken back: a few cover a reply's calls.
MAX_REWINDS = 4


class ReplyStream:
    """The events of `request` on `engine` (`events`, already submitted). Without an engine (a
    test's canned events), `stop` does nothing and the stream cannot be taken back."""

    def __init__(
        self,
        events: AsyncIterator[TokenEvent],
        engine: EnginePort | None = None,
        request: Request | None = None,
    ) -> None:
        self._events = events
        self._engine, self._request = engine, request
        self._current = request  # the request whose events come now
        self.output: list[int] = []  # the reply's tokens so far, those taken back left out
        self.rewinds = 0
        self._ended: TokenEvent | None = None  # the current request's final event, once read
        self._first: Usage | None = None  # the first request's usage, once a rewind ended it

    def __aiter__(self) -> ReplyStream:
        return self

    async def __anext__(self) -> TokenEvent:
        event = await anext(self._events)
        self.output += event.token_ids
        if event.final:
            self._ended = event
        if event.usage is not None and self._first is not None and self._request is not None:
            event = replace(event, usage=self._as_one(event.usage))
        return event

    async def aclose(self) -> None:
        """Close the events (the engine aborts a request whose stream is closed)."""
        await close_iterator(self._events)

    def stop(self) -> None:
        """End generation early: the events finish with `FinishReason.ABORT`."""
        if self._engine is not None and self._current is not None:
            self._engine.abort(self._current.request_id)

    @property
    def can_rewind(self) -> bool:
        """Whether `rewind` may be called: the engine constrains output, and the reply has not
        been taken back `MAX_REWINDS` times."""
        return (
            self._engine is not None
            and self._engine.capabilities.structured_output
            and self.rewinds < MAX_REWINDS
        )

    async def rewind(self, kept: int, grammar: OutputGrammar) -> None:
        """Keep the output's first `kept` tokens, drop the rest, and go on from there under
        `grammar`: the request in flight is stopped and its events read to the end (so the
        engine holds nothing of it; its final event may have been read already), and the next
        events are the new request's."""
        assert self._engine is not None and self._request is not None
        assert self._current is not None and 0 <= kept <= len(self.output)
        self.stop()
        while self._ended is None:
            await anext(self)
        self._first = self._first or self._ended.usage or Usage(0, 0)
        self._ended = None
        await self.aclose()
        self.rewinds += 1
        self.output = self.output[:kept]
        sampling = self._request.sampling
        self._current = replace(
            self._request,
            request_id=f"{self._request.request_id}-{self.rewinds}",
            # It arrives now: the engine's wait for room (`queue_timeout_s`) and a one-off's
            # patience count from here, not from the first request's arrival (a reply that
            # took longer than the timeout was refused as overloaded at once, pool empty).
            arrival_time=time.monotonic(),
            prompt_token_ids=[*self._request.prompt_token_ids, *self.output],
            sampling=replace(
                sampling,
                grammar=grammar,
                max_tokens=sampling.max_tokens - kept,
                min_tokens=max(0, sampling.min_tokens - kept),
            ),
        )
        self._events = self._engine.stream(self._current)

    def _as_one(self, usage: Usage) -> Usage:
        """A later request's usage as the reply's: the first request's prompt and cache, and
        the output kept before this request's prompt ends plus this request's own."""
        assert self._request is not None and self._first is not None
        prompt = len(self._request.prompt_token_ids)
        kept = usage.prompt_tokens - prompt
        return replace(
            self._first,
            prompt_tokens=prompt,
            completion_tokens=kept + usage.completion_tokens,
        )
