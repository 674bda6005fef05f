"""Claude Code's per-request churn is stripped before templating (text/claude_code.py), so two
turns of one session share their prompt prefix token for token."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from semantic.api import anthropic_request as api
from semantic.models.served import ServedModel
from semantic.text import claude_code
from semantic.text.chat import CHATML_TEMPLATE, ChatTemplate

BILLING = "x-anthropic-billing-header: cc_version=2.1.37.0d9; cc_entrypoint=cli; cch={};"
IDENTITY = "You are Claude Code, Anthropic's official CLI for Claude."


def test_a_billing_header_block_is_dropped_whatever_its_hash() -> None:
    for cch in ("fa690", "0c3e1", ""):
        assert claude_code.clean_system([BILLING.format(cch), IDENTITY]) == [IDENTITY]
    assert claude_code.is_billing_header(BILLING.format("fa690"))
    assert not claude_code.is_billing_header(IDENTITY)


def test_text_after_a_billing_line_in_the_same_block_is_kept() -> None:
    block = BILLING.format("fa690") + "\n" + IDENTITY
    assert claude_code.strip_billing_header(block) == IDENTITY
    assert claude_code.clean_system([block]) == [IDENTITY]


def test_a_billing_header_anywhere_but_the_start_is_left_alone() -> None:
    text = "The header looks like this: " + BILLING.format("1")
    assert claude_code.strip_billing_header(text) == text


@pytest.mark.parametrize(
    "countdown",
    [
        "<total_tokens>181234 tokens left</total_tokens>",
        "<system-reminder><total_tokens>9000 tokens left</total_tokens></system-reminder>",
        "<system-reminder>\nToken usage: 18766/200000; 181234 remaining\n</system-reminder>",
        "<system-reminder>Output tokens — turn: 1,234 · session: 56,789</system-reminder>",
        "<system-reminder>USD budget: $0.12/$5.00; $4.88 remaining</system-reminder>",
        "<system-reminder>Remaining conversation turns: 7</system-reminder>",
        "<system-reminder>Messages until auto-compact: 3</system-reminder>",
    ],
)
def test_token_and_budget_countdowns_are_stripped_with_the_space_that_joined_them(
    countdown: str,
) -> None:
    assert claude_code.strip_countdowns(countdown) == ""
    assert claude_code.strip_countdowns(f"file contents\n\n{countdown}") == "file contents"
    assert claude_code.strip_countdowns(f"{countdown}\nplease go on") == "please go on"


def test_reminders_that_carry_instructions_are_kept() -> None:
    todo = "<system-reminder>The todo list is empty. Use TodoWrite.</system-reminder>"
    usage = "<usage><total_tokens>5123</total_tokens></usage>"
    for text in (todo, usage, "plain text"):
        assert claude_code.strip_countdowns(text) == text


@pytest.mark.parametrize(
    ("named", "plain"),
    [
        ("Co-Authored-By: Claude Opus 4.8 (1M context) <noreply@anthropic.com>", "Opus 4.8 <"),
        ("the model named Sonnet 4.6 (1M context). The exact", "Sonnet 4.6. The"),
        ("The exact model ID is claude-opus-4-8[1m].", "claude-opus-4-8."),
        ("The exact model ID is claude-sonnet-4-6[1M].", "claude-sonnet-4-6."),
    ],
)
def test_the_models_1m_context_marker_is_stripped(named: str, plain: str) -> None:
    stripped = claude_code.strip_long_context(named)
    assert plain in stripped and "1M" not in stripped and "[1m]" not in stripped
    assert claude_code.clean_system([IDENTITY, named]) == [IDENTITY, stripped]


def test_text_that_only_mentions_the_1m_suffix_is_left_alone() -> None:
    text = "model ids (`claude-*`, `[1m]`); a model with a long context (1M context)"
    assert claude_code.strip_long_context(text) == text


def test_a_tools_description_names_the_model_without_the_marker() -> None:
    description = "Co-Authored-By: Claude Opus 4.8 (1M context) <x>"
    tool = api.Tool(name="Bash", description=description, input_schema={"type": "object"})
    [function] = api.template_tools([tool]) or []
    assert function["function"]["description"] == "Co-Authored-By: Claude Opus 4.8 <x>"


@pytest.fixture
def chatml(served: ServedModel) -> ServedModel:
    template = ChatTemplate(CHATML_TEMPLATE, bos_token=None, eos_token="<|im_end|>")
    return dataclasses.replace(served, chat_template=template)


def claude_code_turn(cch: str, tokens_left: int, turns: int) -> api.MessagesBody:
    """A Claude-Code-shaped body: billing header first, countdowns in the history."""
    history: list[dict[str, Any]] = []
    for turn in range(turns):
        history += [
            {"role": "user", "content": [{"type": "text", "text": f"question {turn}"}]},
            {"role": "assistant", "content": [{"type": "text", "text": f"answer {turn}"}]},
        ]
    countdown = f"<total_tokens>{tokens_left} tokens left</total_tokens>"
    history.append({"role": "system", "content": countdown})
    history.append(
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_1",
                    "content": f"ok\n<system-reminder>Token usage: 1/2; {tokens_left} "
                    "remaining</system-reminder>",
                },
                {"type": "text", "text": "next"},
            ],
        }
    )
    return api.MessagesBody.model_validate(
        {
            "model": "claude-sonnet-4-5",
            "max_tokens": 32000,
            "system": [
                {"type": "text", "text": BILLING.format(cch)},
                {"type": "text", "text": IDENTITY, "cache_control": {"type": "ephemeral"}},
            ],
            "messages": history,
        }
    )


def test_two_turns_that_differ_only_in_churn_render_the_same_tokens(chatml: ServedModel) -> None:
    first = api.render_prompt(chatml, claude_code_turn("fa690", 181234, turns=2))
    second = api.render_prompt(chatml, claude_code_turn("0c3e1", 179002, turns=2))
    assert first == second
    text = chatml.tokenizer.decode(first, skip_special_tokens=False)
    assert "billing" not in text and "tokens left" not in text and "remaining" not in text
    assert text.startswith(f"<|im_start|>system\n{IDENTITY}<|im_end|>")


def test_a_next_turn_extends_the_previous_prompt_token_for_token(chatml: ServedModel) -> None:
    earlier = api.render_prompt(chatml, claude_code_turn("aaaaa", 5000, turns=1))
    later = api.render_prompt(chatml, claude_code_turn("bbbbb", 4000, turns=2))
    shared = next(i for i, (a, b) in enumerate(zip(earlier, later, strict=False)) if a != b)
    prefix = chatml.tokenizer.decode(later[:shared], skip_special_tokens=False)
    # They part ways only where the histories do: after the first answer, in the next user
    # turn (the tool result, a `<tool_response>` there: ChatML has no place for tools).
    assert prefix.endswith(
        "question 0<|im_end|>\n<|im_start|>assistant\nanswer 0<|im_end|>\n<|im_start|>user\n"
    )
