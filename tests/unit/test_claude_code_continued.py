"""A continued Claude Code session reads its history from the cache: the prompt of a
`claude -p --continue` turn, and of a `--resume` one, rendered as /v1/messages renders it with
Qwen2.5-Coder's template, extends the earlier turn's prompt and answer token for token.

The fixture is Claude Code 2.1.197's three requests of one session (a first `claude -p`, then
`--continue`, then `--resume <id>`, each answered "hi"), their prose replaced by short texts of
our own. The first turn ran on the model's 1M-context variant and named it so ("Opus 4.8 (1M
context)", "claude-opus-4-8[1m]") in the Bash tool's commit trailer and in `# Environment`; the
later turns, restored from the session's transcript, name the plain model. The tools come ~1K
tokens into the prompt, so a continued turn re-read only those (5% of 19,885 tokens, measured).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from semantic.api.anthropic_request import PromptBody, render_prompt
from semantic.models.served import ServedModel

FIXTURE = Path(__file__).parent.parent / "fixtures" / "claude_code_2_1_continued_session.json"
RECORDED: dict[str, Any] = json.loads(FIXTURE.read_text())
# Each turn, and the one after it: a continued turn after the first, a resumed one after that.
NEXT_TURNS = [("first", "continued"), ("continued", "resumed")]


def _prompt(model: ServedModel, turn: str) -> list[int]:
    return render_prompt(model, PromptBody.model_validate(RECORDED[turn]))


def _answered(model: ServedModel, turn: str) -> list[int]:
    """The turn's prompt and its answer, closed: what the server holds once it answered."""
    eos = model.chat_template.eos_token or ""
    return _prompt(model, turn) + model.tokenizer.encode(RECORDED["answer"] + eos)


def test_the_recorded_first_turn_names_the_1m_context_model_and_the_later_ones_do_not() -> None:
    def says_1m(turn: str) -> bool:
        body = RECORDED[turn]
        return "(1M context)" in body["system"][2]["text"] + body["tools"][1]["description"]

    assert says_1m("first") and not says_1m("continued") and not says_1m("resumed")


@pytest.mark.parametrize(("earlier", "later"), NEXT_TURNS)
def test_a_later_turn_extends_the_earlier_prompt_and_answer(
    qwen: ServedModel, earlier: str, later: str
) -> None:
    answered, next_prompt = _answered(qwen, earlier), _prompt(qwen, later)
    assert next_prompt[: len(answered)] == answered


def test_the_first_turn_names_the_model_as_the_later_turns_do(qwen: ServedModel) -> None:
    text = qwen.tokenizer.decode(_prompt(qwen, "first"), skip_special_tokens=False)
    assert "Co-Authored-By: Claude Opus 4.8 <noreply@anthropic.com>" in text
    assert "named Opus 4.8. The exact model ID is claude-opus-4-8." in text
    assert "1M context" not in text and "[1m]" not in text


def test_with_qwen25_coders_own_tokenizer_and_template(qwen_coder: ServedModel) -> None:
    model = qwen_coder
    for earlier, later in NEXT_TURNS:
        answered, next_prompt = _answered(model, earlier), _prompt(model, later)
        assert next_prompt[: len(answered)] == answered
