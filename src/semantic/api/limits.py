"""Request limits, each a setting: how many messages, tools and stop strings one
request may carry (and how long a stop string may be), and how many tokens its prompt and its
answer may have. (The body's size is bodies.py's; the
context's, the engine's.) Every refusal is a 400 that names the field, in the protocol's shape
(errors.py). The output budget is the one place where the protocols differ on purpose
(`OutputBudget`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

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
    """`max_tokens` cut to `max_output_tokens`: for a default, and where a protocol clamps
    (`OutputBudget.clamp`)."""
    limit = settings.max_output_tokens
    return max_tokens if limit is None else min(max_tokens, limit)


@dataclass(slots=True, frozen=True)
class OutputBudget:
    """What a request asks of its answer's length (`requested`, in the field `param`; None: it
    asks for none, and gets `default`), and what its protocol does with too much.

    OpenAI's APIs and the agent API refuse a budget past `max_output_tokens` or past the room
    the context leaves, naming the field, as OpenAI's API refuses more than a model can write.
    Anthropic's clamps it to both (`clamp`), because its clients ask for 32000 or more
    whatever the model (Claude Code does), and a `max_tokens` of 0 (a cache pre-warm) runs one
    step, whose token is not returned. Either way a prompt that leaves no room at all is a
    context overflow that blames `prompt_param`, the field that holds the prompt."""

    requested: int | None
    default: int
    clamp: bool = False
    param: str = "max_tokens"
    prompt_param: str = "messages"

    def asked(self, settings: Settings) -> int | None:
        """The budget asked for, read as the protocol reads it: cut to `max_output_tokens`
        where it clamps (then never None), refused past it where it does not."""
        if self.clamp:
            return capped_max_tokens(
                settings, self.default if self.requested is None else self.requested
            )
        return checked_max_tokens(settings, self.requested, self.param)


def output_budget(
    settings: Settings, budget: OutputBudget, prompt_tokens: int, context: int
) -> int:
    """max_tokens for a request whose prompt has `prompt_tokens` in a `context`: what it asked
    for (`OutputBudget`), refused or clamped as its protocol says; with none asked, the
    default cut to `max_output_tokens` and to the room the context leaves."""
    asked = budget.asked(settings)
    room = context - prompt_tokens
    if room < 1:
        raise ContextOverflow(
            prompt_tokens, 0 if budget.clamp else asked or 0, context, budget.prompt_param
        )
    if budget.clamp:
        assert asked is not None
        return max(1, min(asked, room))
    if asked is not None and asked > room:
        raise ContextOverflow(
            prompt_tokens, asked, context, budget.prompt_param, blame=budget.param
        )
    return asked if asked is not None else min(capped_max_tokens(settings, budget.default), room)
