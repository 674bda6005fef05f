"""The cheap bound on a prompt, checked on its request's JSON before anything costly (validating
the body, rendering the chat template, tokenizing): no more characters of text, and no more JSON
objects, than the longest prompt the model takes could hold, however it tokenized.

Without it a 9.5 MB body was validated, rendered and tokenized (15 s of CPU) only to learn it was
300 times the context, and 100,000 two-character messages cost 4 s the same way. The bound is
proportional to the context and generous: real prompts run 3 to 5 characters a token (Claude
Code's 19K-token prompt is 80K characters) and one JSON object to 25 tokens or more; only a run
of one character (64 spaces, a line of `=`) comes near `CHARS_PER_TOKEN` in one token. Past the
bound, a request is a context overflow in its protocol's shape, as one found too long after
tokenizing is; under it, the tokenizer decides.
"""

from __future__ import annotations

from typing import Any

from fastapi import Request

from semantic.api import offload
from semantic.api.bodies import LimitedBodyRoute
from semantic.api.gate import engine_of
from semantic.errors import PromptPastContext

CHARS_PER_TOKEN = 32  # more than any real prompt averages, by six times or more
# The field that holds the prompt, on each route whose body has one.
PROMPT_FIELDS = {
    "/v1/messages": "messages",
    "/v1/messages/count_tokens": "messages",
    "/v1/chat/completions": "messages",
    "/v1/completions": "prompt",
    "/v1/responses": "input",
}


class PromptRoute(LimitedBodyRoute):
    """A route of an API whose bodies may hold a prompt: on the routes of `PROMPT_FIELDS`, the
    body's JSON is bounded (`check_size`) before FastAPI or the route validates it."""

    async def check_body(self, request: Request) -> None:
        param = PROMPT_FIELDS.get(self.path)
        if param is None or request.method != "POST" or not await request.body():
            return  # no prompt here; an empty body is FastAPI's to refuse
        # One token of the sequence is left to answer with (max_prompt_tokens is the
        # tokenizer's to apply: counting a prompt past it is no error).
        limit = engine_of(request).max_seq_tokens - 1
        # Python over every value of the body, a large one's on a worker thread: the event
        # loop gets the GIL back every few milliseconds.
        body = await request.body()
        await offload.run(len(body), check_size, await request.json(), limit, param)


def check_size(body: Any, limit: int, param: str) -> None:
    """A context overflow naming `param` when `body` (parsed JSON) holds more objects than
    `limit` (messages, content blocks, tools, schema nodes: each renders to a token or more), or
    more characters, keys and values together, than `limit` tokens of `CHARS_PER_TOKEN`.

    Read level by level, in comprehensions (a client's JSON may nest 128 deep; a loop that
    looks at one value at a time is slower by half), and no further than the level that goes
    past the bound: 100,000 messages are refused once they are counted, before their contents
    are read."""
    chars = objects = 0
    level = [body]
    while level:
        objects += sum(isinstance(item, dict) for item in level)
        if objects > limit:
            raise PromptPastContext(objects, limit, param, _too_many(objects, limit))
        chars += sum(len(item) for item in level if isinstance(item, str))
        chars += sum(len(key) for item in level if isinstance(item, dict) for key in item)
        if chars > limit * CHARS_PER_TOKEN:
            fewest = -(-chars // CHARS_PER_TOKEN)
            raise PromptPastContext(fewest, limit, param, _too_long(chars, limit))
        level = [
            child
            for item in level
            if isinstance(item, (dict, list))
            for child in (item.values() if isinstance(item, dict) else item)
        ]


def _too_many(objects: int, limit: int) -> str:
    return (
        f"the request holds {objects:,} JSON objects or more (messages, content blocks, tools), "
        f"more than a prompt of at most {limit:,} tokens can hold (each takes a token or more)"
    )


def _too_long(chars: int, limit: int) -> str:
    return (
        f"the request holds {chars:,} characters of text or more, more than a prompt of at most "
        f"{limit:,} tokens can hold (this server reads at most {CHARS_PER_TOKEN} characters a "
        f"token: {limit * CHARS_PER_TOKEN:,} characters)"
    )
