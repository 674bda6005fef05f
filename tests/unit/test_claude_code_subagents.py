"""Claude Code's subagents start warm: a session's two subagents (the Agent tool), rendered as
/v1/messages renders them with Qwen2.5-Coder's template, share their prompt but for their tasks,
and the first shares the identity line and the tools up to the first one only the session has
with the session's request; the server reads those prefixes from its cache.

The fixtures are Claude Code 2.1.197's requests of `claude -p` whose model (a scripted fake
server) started two general-purpose subagents: the session's first request and each subagent's
first, their prose replaced by short texts of our own. A subagent's system prompt is its agent
type's instructions (with an `<env>` element) after the session's identity line; its tools are
the session's less three (ScheduleWakeup, TaskOutput, Workflow), same schemas, same order; its
early system message lists skills where the session's lists agent types.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from semantic.api.anthropic_request import (
    PromptBody,
    render_prompt,
    template_messages,
    template_tools,
)
from semantic.models.served import ServedModel
from semantic.text import claude_code
from tests.unit.fakes import running, shared_prefix

FIXTURES = Path(__file__).parent.parent / "fixtures"
SESSION_ONLY_TOOLS = {"ScheduleWakeup", "TaskOutput", "Workflow"}
BLOCK = 64  # the fake runner's block: at most one partial block of a shared prefix is not read


def _recorded(name: str) -> dict[str, Any]:
    recorded: dict[str, Any] = json.loads(
        (FIXTURES / f"claude_code_subagent_{name}.json").read_text()
    )
    return recorded


def _body(name: str) -> PromptBody:
    return PromptBody.model_validate(_recorded(name)["body"])


def _text(model: ServedModel, name: str) -> str:
    body = _body(name)
    messages = template_messages(body, model.chat_template.later_system_turns)
    return model.chat_template.render(messages, tools=template_tools(body.tools))


def test_the_recorded_subagents_are_the_session_less_a_few_tools() -> None:
    main, first, second = (_recorded(name)["body"] for name in ("main", "1", "2"))
    session_tools = [t for t in main["tools"] if t["name"] not in SESSION_ONLY_TOOLS]
    assert first["tools"] == second["tools"] == session_tools
    assert first["system"][1] == second["system"][1] == main["system"][1]  # the identity line
    assert first["system"][2] == second["system"][2] != main["system"][2]
    assert first["messages"][0]["content"][1] != second["messages"][0]["content"][1]


def test_a_second_subagents_first_request_shares_its_prompt_with_the_firsts(
    qwen: ServedModel,
) -> None:
    first, second = render_prompt(qwen, _body("1")), render_prompt(qwen, _body("2"))
    shared = shared_prefix(first, second)
    assert shared >= 0.9 * len(second)
    # They part at the task: the instructions, the tools, the skills and the environment come
    # before it.
    before = qwen.tokenizer.decode(second[:shared])
    assert before.rstrip().endswith("</system-reminder>")
    assert "</tools>" in before and "available for use with the Skill tool" in before


def test_a_first_subagent_shares_the_identity_line_and_tools_with_the_session(
    qwen: ServedModel,
) -> None:
    session, first = render_prompt(qwen, _body("main")), render_prompt(qwen, _body("1"))
    before = qwen.tokenizer.decode(
        first[: shared_prefix(session, first)], skip_special_tokens=False
    )
    # Every tool up to ReportFindings, the last before the first one only the session has.
    names = [tool["name"] for tool in _recorded("1")["body"]["tools"]]
    common = names[: names.index("ReportFindings") + 1]
    assert re.findall(r'"name": "(\w+)", "description"', before) == common
    assert before.startswith("<|im_start|>system\nYou are a Claude agent")
    assert "You are a subagent" not in before and "You are a coding agent" not in before


def test_the_identity_line_and_the_tools_come_first_then_the_instructions(
    qwen: ServedModel,
) -> None:
    text = _text(qwen, "1")
    system = [block["text"] for block in _recorded("1")["body"]["system"]]
    identity, instructions = system[1], system[2]
    assert text.startswith(f"<|im_start|>system\n{identity}\n\n# Tools\n")
    tools_end = text.index("</tools>")
    shared, own = claude_code.split_session(instructions.strip())
    assert tools_end < text.index(f"<|im_start|>system\n{shared}<|im_end|>")
    assert text.index(shared) < text.index("available for use with the Skill tool")
    assert text.index("available for use with the Skill tool") < text.index(own)
    assert own.startswith("Here is useful information") and own.endswith("</env>")
    assert text.index(own) < text.index("<|im_start|>user\n<system-reminder>")


def test_the_model_is_told_the_same_words(qwen: ServedModel) -> None:
    """Every line of the system prompt (but the billing header) is in the system context, and
    the system context says nothing else but the tools and the early system message."""
    for name in ("main", "1"):
        text, body = _text(qwen, name), _recorded(name)["body"]
        context = text[: text.index("<|im_start|>user\n")]
        lines = [line for block in body["system"][1:] for line in block["text"].split("\n")]
        assert [line for line in lines if line not in context] == []
        words = " ".join(block["text"] for block in body["system"][1:]).split()
        early = body["messages"][1]["content"].split()
        tools_end = context.index("</tool_call><|im_end|>") + len("</tool_call>")
        tools = context[context.index("\n\n# Tools\n") : tools_end]
        rest = context.replace(tools, " ").replace("<|im_start|>system", " ")
        assert sorted(rest.replace("<|im_end|>", " ").split()) == sorted(words + early)


def test_split_identity_takes_a_one_line_first_block_only() -> None:
    identity, rest = claude_code.split_identity(["You are an agent.", "Be brief.\n\nAnd right."])
    assert (identity, rest) == ("You are an agent.", ["Be brief.\n\nAnd right."])
    assert claude_code.split_identity(["You are an agent."]) == ("", ["You are an agent."])
    blocks = ["You are an agent.\nBe brief.", "More."]
    assert claude_code.split_identity(blocks) == ("", blocks)


def _usage(client: Any, name: str) -> dict[str, int]:
    recorded = _recorded(name)
    body = recorded["body"] | {"max_tokens": 1, "stream": False}
    response = client.post("/v1/messages", json=body, headers=recorded["headers"])
    assert response.status_code == 200, response.text
    usage: dict[str, int] = response.json()["usage"]
    return usage


def test_each_subagent_reads_what_it_shares_from_the_servers_cache(
    qwen: ServedModel, tmp_path: Path
) -> None:
    """Through the server: the session's request, then the two subagents' (each an agent of
    its own), each reading from the cache the prefix it shares with an earlier request."""
    session, first, second = (render_prompt(qwen, _body(name)) for name in ("main", "1", "2"))
    blocks = 2 * (len(session) + len(first) + len(second)) // BLOCK  # room for all, twice
    with running(qwen, tmp_path, num_blocks=blocks, block_tokens=BLOCK) as (client, _, _):
        reads = [_usage(client, name)["cache_read_input_tokens"] for name in ("main", "1", "2")]
    assert reads[0] == 0
    assert reads[1] >= shared_prefix(session, first) - BLOCK
    assert reads[2] >= 0.9 * len(second) and reads[2] >= shared_prefix(first, second) - BLOCK


def test_with_qwen25_coders_own_tokenizer_and_template(qwen_coder: ServedModel) -> None:
    model = qwen_coder
    session, first, second = (render_prompt(model, _body(name)) for name in ("main", "1", "2"))
    assert shared_prefix(first, second) >= 0.9 * len(second)
    before = model.tokenizer.decode(first[: shared_prefix(session, first)])
    assert '"name": "ReportFindings"' in before and "\n</tools>" not in before
