"""Request limits, each a setting: how many messages, tools and stop strings one
request may carry (and how long a stop string may be), and how many tokens its prompt and its
answer may have. (The body's size is bodies.py's; the
context's, the engine's.) Every refusal is a 400 that names the field, in the protocol's shape
(errors.py).
"""

from __future__ import annotations

from collections.abc import Sequence

from semantic.errors import ContextOverflow, InvalidRequest, PromptTooLong
from semantic.settings.settings import Settings


def check_counts(settings: Settings, messages: int, tools: int) -> None:
    """A 400 for more messages than `max_messages` or more tools than `max_tools`."""
    if messages > settings.max_messages:
        raise InvalidRequest(
            f"messages: {messages} messages; this server takes at most {settings.max_messages} "
            "(max_messages)",
            param="messages",
        )
    if tools > settings.max_tools:
        raise InvalidRequest(
            f"tools: {tools} tools; this server takes at most {settings.max_tools} (max_tools)",
            param="tools",
        )


def check_stops(settings: Settings, stops: Sequence[str], param: str) -> None:
    """A 400 naming `param` for more stop strings than `max_stop_sequences`, or one longer than
    `max_stop_sequence_chars`: the engine thread matches them against every token."""
    if len(stops) > settings.max_stop_sequences:
        raise InvalidRequest(
            f"{param}: {len(stops)} stop sequences; this server takes at most "
            f"{settings.max_stop_sequences} (max_stop_sequences)",
            param=param,
        )
    longest = max(map(len, stops), default=0)
    if longest > settings.max_stop_sequence_chars:
        raise InvalidRequest(
            f"{param}: a stop sequence of {longest} characters; this server takes at most "
            f"{settings.max_stop_sequence_chars} (max_stop_sequence_chars)",
            param=param,
        )


def check_prompt(settings: Settings, prompt_tokens: int, param: str = "messages") -> None:
    """A 400 (a context overflow, PromptTooLong) for a prompt longer than `max_prompt_tokens`;
    `param` is the field that holds the prompt."""
    limit = settings.max_prompt_tokens
    if limit is not None and prompt_tokens > limit:
        raise PromptTooLong(prompt_tokens, limit, param)


def checked_max_tokens(
    settings: Settings, requested: int | None, param: str = "max_tokens"
) -> int | None:
    """The output budget a request asked for, or a 400 naming `param` when it is more than
    `max_output_tokens` (as OpenAI's API refuses more than a model can write)."""
    limit = settings.max_output_tokens
    if requested is not None and limit is not None and requested > limit:
        raise InvalidRequest(
            f"{param}: {requested} is more than this server generates per request: at most "
            f"{limit} (max_output_tokens)",
            param=param,
        )
    return requested


def capped_max_tokens(settings: Settings, max_tokens: int) -> int:
    """`max_tokens` cut to `max_output_tokens`: for a default, and on /v1/messages, whose clients
    ask for 32000 or more whatever the model (Claude Code does), so it clamps instead of
    refusing."""
    limit = settings.max_output_tokens
    return max_tokens if limit is None else min(max_tokens, limit)


def output_budget(
    settings: Settings,
    requested: int | None,
    prompt_tokens: int,
    context: int,
    default: int,
    *,
    param: str = "max_tokens",
    prompt_param: str = "messages",
) -> int:
    """max_tokens for a request: what it asked for (`param`), refused past `max_output_tokens`
    or past the room the context leaves (a context overflow that blames `prompt_param`, the
    field that holds the prompt, when it leaves no room, else `param`, which the client can
    lower); with none asked, `default` cut to both."""
    asked = checked_max_tokens(settings, requested, param)
    room = context - prompt_tokens
    if room < 1:
        raise ContextOverflow(prompt_tokens, asked or 0, context, prompt_param)
    if asked is not None and asked > room:
        raise ContextOverflow(prompt_tokens, asked, context, prompt_param, blame=param)
    return asked if asked is not None else min(capped_max_tokens(settings, default), room)
