"""Thinking in every API: what a request asks of a thinking model (Anthropic's `thinking` and
`output_config.effort`, OpenAI's `reasoning_effort`, the Responses API's `reasoning.effort`)
turned into the chat template's switches, and the parser that tells the reply's reasoning from
its answer (text/reasoning.py). A model that does not think has no format: every switch is
accepted and changes nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request

from semantic.api import offload
from semantic.api.auth import caller_of
from semantic.api.bodies import body_limit
from semantic.api.seal import Seals
from semantic.api.structured_output import OutputFormat, output_grammar
from semantic.api.tool_use import ToolUse
from semantic.models.served import ServedModel
from semantic.server_key import ServerKey
from semantic.text.grammar import Grammar
from semantic.text.reasoning import (
    ReasoningFormat,
    ReasoningParser,
    ThinkingSwitch,
    effort_level,
    hidden_markers,
    reasoning_format,
)


@dataclass(slots=True)
class Thinking:
    """One request's thinking: the model's format (None: it does not think), what the request
    asked, whether its output is held to a grammar (then it does not think), and whether the
    client is shown the reasoning (`display: "omitted"` hides it, and its seal holds none)."""

    fmt: ReasoningFormat | None
    switch: ThinkingSwitch = field(default_factory=ThinkingSwitch)
    constrained: bool = False
    shown: bool = True

    @classmethod
    def of(
        cls,
        model: ServedModel,
        switch: ThinkingSwitch,
        *,
        constrained: bool = False,
        shown: bool = True,
    ) -> Thinking:
        return cls(reasoning_format(model.chat_template), switch, constrained, shown)

    @property
    def template_vars(self) -> dict[str, Any]:
        return {} if self.fmt is None else self.fmt.template_vars(self.switch, self.constrained)

    @property
    def prefill(self) -> str:
        """What the reply is forced to start with (harmony's final channel under a grammar)."""
        return "" if self.fmt is None else self.fmt.answer_prefill(self.constrained)

    def parser(self, model: ServedModel, prompt_ids: list[int]) -> ReasoningParser | None:
        """The reply's reasoning parser; None when the model does not think, or its reply
        starts as an answer (a prefill). It starts inside the reasoning when the prompt
        opened it (templates that always think end the prompt with `<think>`)."""
        if self.fmt is None or self.prefill:
            return None
        tail = model.tokenizer.decode(prompt_ids[-8:], skip_special_tokens=False)
        return ReasoningParser(self.fmt, started=tail.rstrip().endswith(self.fmt.opener))

    def hidden(self, model: ServedModel) -> dict[int, str]:
        return {} if self.fmt is None else hidden_markers(self.fmt, model.tokenizer)


def seals_of(request: Request) -> Seals:
    """The request's seals: the server's key, the caller's owner, and the body limit as the
    most its seals may unpack to, all together."""
    key: ServerKey = request.app.state.seal_key
    return Seals(key, caller_of(request).owner, body_limit(request.app))


def anthropic_switch(kind: str | None, effort: str | None) -> ThinkingSwitch:
    """Anthropic's `thinking.type` (`enabled`, `adaptive`: on; `disabled` and any other: off;
    absent: the model's default) and `output_config.effort`."""
    enabled = None if kind is None else kind in ("enabled", "adaptive")
    return ThinkingSwitch(enabled, effort_level(effort))


# The prompt of a request, rendered with the template's switches and ending with the text the
# reply is forced to start with: `render(reply_start, template_vars) -> token ids`.
Render = Callable[[str, dict[str, Any]], list[int]]


async def shape_reply(
    model: ServedModel,
    output: OutputFormat | None,
    tools: ToolUse,
    thinking: Thinking,
    render: Render,
    body_bytes: int,
) -> tuple[list[int], Grammar | None]:
    """What every generation route does before it submits: compile the grammar the reply must
    follow (structured output, or tool calls held to their schemas), which turns thinking off
    unless it leaves free text around the calls; render the prompt with the thinking switch and
    the reply's forced start; and set the reply's reasoning parser on `tools`. A grammar is
    compiled on a worker thread whatever the body's size (a new schema takes milliseconds, the
    model's first one more than a second); the prompt is rendered on one for a body of more than
    a few KB (api/offload.py). Returns the prompt's token ids and the grammar."""
    grammar = None
    if tools.active or (output is not None and output.kind != "text"):  # else free text
        grammar = await asyncio.to_thread(output_grammar, model, output, tools)
    thinking.constrained = grammar is not None and not grammar.lazy
    reply_start = thinking.prefill + tools.prefill
    prompt_ids = await offload.run(body_bytes, render, reply_start, thinking.template_vars)
    tools.think(thinking.parser(model, prompt_ids), thinking.hidden(model))
    return prompt_ids, grammar
