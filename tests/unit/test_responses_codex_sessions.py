"""Codex's new sessions start warm: two sessions' first requests (two folders), rendered as the
Responses route renders them with Qwen2.5-Coder's template, share everything up to the
environment context. And Codex's freeform apply_patch tool is offered with its grammar.

The fixtures are Codex 0.171's first requests of `codex exec "create out.txt containing 42"`
in two folders, their long texts replaced by our own wording: the shapes, tool names and
schemas are Codex's.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from semantic.api.openai_tools import template_tools
from semantic.api.pipeline import render_messages
from semantic.api.responses import prompt_messages
from semantic.api.responses_request import ResponsesBody, Tool, input_items, item_messages
from semantic.models.served import ServedModel
from tests.unit.fakes import shared_prefix
from tests.unit.test_responses_api import scripted

FIXTURES = Path(__file__).parent.parent / "fixtures"


def _codex_body(session: str) -> ResponsesBody:
    recorded = json.loads((FIXTURES / f"codex_0_171_new_session_{session}.json").read_text())
    return ResponsesBody.model_validate(recorded["body"])


def _prompt(model: ServedModel, body: ResponsesBody) -> list[int]:
    messages = prompt_messages(body, [], item_messages(input_items(body)))
    return render_messages(model, messages, template_tools(body.functions()))


def test_a_second_sessions_first_request_shares_its_prefix_with_the_firsts(
    qwen: ServedModel,
) -> None:
    first, second = _prompt(qwen, _codex_body("a")), _prompt(qwen, _codex_body("b"))
    shared = shared_prefix(first, second)
    assert shared >= 0.9 * len(second)
    # What differs (the folder) is in the environment context, after the instructions, the
    # tools and the permissions, which every session shares.
    before = qwen.tokenizer.decode(second[:shared])
    assert "</tools>" in before and "</permissions instructions>" in before
    assert before.endswith("<cwd>/home/user/project-")


def _apply_patch(body: ResponsesBody) -> Tool:
    tools = [tool for tool in body.tools or [] if tool.name == "apply_patch"]
    assert tools, "the fixture's tools have no apply_patch"
    return tools[0]


def _with_apply_patch() -> ResponsesBody:
    """Session a as Codex sends it for a model whose metadata asks for a freeform apply_patch."""
    raw: dict[str, Any] = _codex_body("a").model_dump(exclude_none=True)
    raw["tools"].insert(3, APPLY_PATCH)
    return ResponsesBody.model_validate(raw)


def test_a_freeform_tool_is_offered_with_its_grammar() -> None:
    offered = _apply_patch(_with_apply_patch()).as_function().function
    assert offered.parameters == {
        "type": "object",
        "properties": {"input": {"type": "string"}},
        "required": ["input"],
    }
    assert offered.description is not None
    assert offered.description.startswith(APPLY_PATCH["description"])
    assert "in this lark grammar:\nstart: begin_patch hunk+ end_patch" in offered.description


def test_a_freeform_call_comes_back_as_a_custom_tool_call_with_its_input(
    qwen: ServedModel, tmp_path: Path
) -> None:
    patch = "*** Begin Patch\n*** Add File: out.txt\n+42\n*** End Patch\n"
    call = {"name": "apply_patch", "arguments": {"input": patch}}
    client, runner = scripted(qwen, tmp_path)
    runner.say(qwen.tokenizer.encode(f"<tool_call>\n{json.dumps(call)}\n</tool_call>"))
    body = {"model": "m", "input": "create out.txt containing 42", "tools": [APPLY_PATCH]}
    with client:
        response = client.post("/v1/responses", json=body | {"stream": True})
    done = [
        json.loads(line.removeprefix("data: "))
        for line in response.text.splitlines()
        if line.startswith("data: ") and "response.output_item.done" in line
    ]
    (item,) = [event["item"] for event in done]
    assert item["type"] == "custom_tool_call" and item["name"] == "apply_patch"
    assert item["input"] == patch and item["call_id"]


def test_a_freeform_tool_without_a_grammar_keeps_its_description() -> None:
    plain = Tool.model_validate({"type": "custom", "name": "note", "description": "Takes a note."})
    assert plain.as_function().function.description == "Takes a note."


# Codex 0.171's apply_patch, as it sends it when the model's metadata says
# `apply_patch_tool_type: "freeform"` (the description in our own words).
APPLY_PATCH: dict[str, Any] = {
    "type": "custom",
    "name": "apply_patch",
    "description": "Edits files with a patch. A freeform tool: the patch is not JSON.",
    "format": {
        "type": "grammar",
        "syntax": "lark",
        "definition": "start: begin_patch hunk+ end_patch\n"
        'begin_patch: "*** Begin Patch" LF\n'
        'end_patch: "*** End Patch" LF?\n\n'
        "hunk: add_hunk | delete_hunk | update_hunk\n"
        'add_hunk: "*** Add File: " filename LF add_line+\n'
        'delete_hunk: "*** Delete File: " filename LF\n'
        'update_hunk: "*** Update File: " filename LF change_move? change?\n\n'
        "filename: /(.+)/\n"
        'add_line: "+" /(.*)/ LF -> line\n\n'
        'change_move: "*** Move to: " filename LF\n'
        "change: (change_context | change_line)+ eof_line?\n"
        'change_context: ("@@" | "@@ " /(.+)/) LF\n'
        'change_line: ("+" | "-" | " ") /(.*)/ LF\n'
        'eof_line: "*** End of File" LF\n\n'
        "%import common.LF\n",
    },
}
