"""Claude Code's new sessions start warm: two sessions' first requests (two folders, one a git
repository), rendered as /v1/messages renders them with Qwen2.5-Coder's template, share
everything but the sessions' own sections, which come last; and the model is told the same
words as before, all as system context.

The fixtures are Claude Code 2.1.197's first requests of `claude -p` in two folders, their prose
replaced by short texts of our own: the section headings, the per-session lines, the message
shapes, tool names and schemas are Claude Code's.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from semantic.api.anthropic_request import (
    PromptBody,
    render_prompt,
    template_messages,
    template_tools,
)
from semantic.models.served import ServedModel
from semantic.text import claude_code
from semantic.text.chat import CHATML_TEMPLATE, ChatTemplate
from tests.qwen25_template import QWEN25_TEMPLATE
from tests.unit.fakes import shared_prefix

FIXTURES = Path(__file__).parent.parent / "fixtures"
GENERATION_PROMPT = "<|im_start|>assistant\n"

# A template that takes a system message first only (as Gemma's does), and one that drops later
# ones silently: both keep the system prompt whole.
FIRST_SYSTEM_ONLY = (
    "{% for m in messages %}{% if m.role == 'system' and not loop.first %}"
    "{{ raise_exception('system messages go first') }}{% endif %}"
    "{{ m.role }}: {{ m.content }}\n{% endfor %}"
)
DROPS_LATER_SYSTEM = (
    "{% for m in messages %}{% if m.role != 'system' or loop.first %}"
    "{{ m.role }}: {{ m.content }}\n{% endif %}{% endfor %}"
)


def _recorded(session: str) -> dict[str, Any]:
    path = FIXTURES / f"claude_code_2_1_new_session_{session}.json"
    body: dict[str, Any] = json.loads(path.read_text())["body"]
    return body


def _body(session: str) -> PromptBody:
    return PromptBody.model_validate(_recorded(session))


def _bare(session: str) -> PromptBody:
    """A new session's first request in `claude -p --bare` (a, b: two folders, b a git
    repository): an identity line, then `CWD:` and `Date:` (and b's git status), three tools."""
    path = FIXTURES / f"claude_code_2_1_bare_session_{session}.json"
    return PromptBody.model_validate(json.loads(path.read_text())["body"])


def _template(source: str) -> ChatTemplate:
    return ChatTemplate(source, bos_token=None, eos_token="<|im_end|>")


def _text(model: ServedModel, body: PromptBody) -> str:
    messages = template_messages(body, model.chat_template.later_system_turns)
    return model.chat_template.render(messages, tools=template_tools(body.tools))


def test_a_second_sessions_first_request_shares_its_prefix_with_the_firsts(
    qwen: ServedModel,
) -> None:
    first, second = render_prompt(qwen, _body("a")), render_prompt(qwen, _body("b"))
    shared = shared_prefix(first, second)
    assert shared >= 0.9 * len(second)
    # What differs (the memory folder, named for the project) comes after the instructions, the
    # tools and the agent types, which every session shares.
    before = qwen.tokenizer.decode(second[:shared])
    assert "</tools>" in before and "Available agent types" in before
    assert before.endswith("file-based memory at `/home/user/.claude/projects/-home-user-")


def test_the_sessions_own_sections_come_last_as_a_system_turn(qwen: ServedModel) -> None:
    text = _text(qwen, _body("a"))
    tools_end, agents = text.index("</tools>"), text.index("Available agent types")
    own = text.index("<|im_start|>system\n# Memory\n")
    assert tools_end < agents < own < text.index("<|im_start|>user\n<system-reminder>")
    assert text.index("# Environment\n") > own and text.index("gitStatus: ") > own


def test_the_model_is_told_the_same_words(qwen: ServedModel) -> None:
    recorded = _recorded("a")
    text = _text(qwen, _body("a"))
    sections = recorded["system"][2]["text"].strip().split("\n\n")
    assert all(text.count(section) == 1 for section in sections)
    assert text.count(recorded["messages"][1]["content"]) == 1
    assert "say hi" in text[text.index("<|im_start|>user\n") :]


def test_a_sessions_later_turns_keep_its_prefix(qwen: ServedModel) -> None:
    first_turn = _recorded("a")
    second_turn = first_turn | {
        "messages": [
            *first_turn["messages"],
            {"role": "assistant", "content": [{"type": "text", "text": "Hi!"}]},
            {"role": "user", "content": "Now list the files."},
        ]
    }
    before = _text(qwen, _body("a")).removesuffix(GENERATION_PROMPT)
    after = _text(qwen, PromptBody.model_validate(second_turn))
    assert after.startswith(before)


def test_bare_sessions_share_the_identity_and_the_tools_and_part_at_the_working_folder(
    qwen: ServedModel,
) -> None:
    first, second = render_prompt(qwen, _bare("a")), render_prompt(qwen, _bare("b"))
    before = qwen.tokenizer.decode(second[: shared_prefix(first, second)])
    # The prompts part in the folder's name, after the identity line and the tools.
    assert "</tools>" in before and before.count("CWD: ") == 1
    assert before.endswith("\nCWD: /home/user/")
    text = _text(qwen, _bare("b"))
    own = text.index("<|im_start|>system\nCWD: /home/user/other\nDate: ")
    assert text.index("</tools>") < own < text.index("gitStatus: ") < text.index("<|im_start|>user")


@pytest.mark.parametrize("source", [FIRST_SYSTEM_ONLY, DROPS_LATER_SYSTEM])
def test_a_template_without_later_system_turns_keeps_the_system_prompt_whole(
    source: str,
) -> None:
    assert not _template(source).later_system_turns
    recorded = _recorded("a")
    system, user, *rest = template_messages(_body("a"), later_system_turns=False)
    assert system["role"] == "system" and "# Memory\n" in system["content"]
    assert user["role"] == "user" and recorded["messages"][1]["content"] in user["content"]
    assert not rest


def test_chatml_and_qwen_give_later_system_messages_turns_of_their_own() -> None:
    assert _template(CHATML_TEMPLATE).later_system_turns
    assert _template(QWEN25_TEMPLATE).later_system_turns


def test_split_session_keeps_every_word_and_the_order() -> None:
    system = _recorded("a")["system"][2]["text"]
    shared, own = claude_code.split_session(system)
    assert own.startswith("# Memory\n") and own.index("# Environment") < own.index("gitStatus:")
    assert "# Context management" in shared and "# Memory" not in shared
    assert sorted((shared + "\n\n" + own).split()) == sorted(system.split())


def test_split_session_moves_an_env_element() -> None:
    system = (
        "You are an agent.\n\n"
        "Here is useful information about the environment you are running in:\n"
        "<env>\nWorking directory: /home/user/a\nIs directory a git repo: Yes\n</env>\n"
        "Keep answers short."
    )
    shared, own = claude_code.split_session(system)
    assert shared == "You are an agent.\n\nKeep answers short."
    assert own.startswith("Here is useful information") and own.endswith("</env>")


def test_split_session_leaves_other_system_prompts_alone() -> None:
    system = "You are a helpful assistant.\n\n# Style\nBe brief."
    assert claude_code.split_session(system) == (system, "")
