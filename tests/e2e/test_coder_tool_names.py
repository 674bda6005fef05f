"""No made-up tool call reaches a client as text on a real coder model: `qwen2.5-coder-0.5b`,
with Claude Code's tools and the prompts of benchmarks/tool_calls.py on which it wrote calls of
tools nobody offered (`GitBranch`, `Search`, `ListMarkdownFiles`), answers each with calls of
offered tools whose arguments match their schemas, or with text that holds no such call; and
one of them at least calls (docs/clients.md, "Made-up tool names")."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import jsonschema
import pytest

from tests.e2e.conftest import Server

pytestmark = pytest.mark.e2e

SUITE = json.loads(
    (Path(__file__).parents[2] / "benchmarks" / "tool_call_prompts.json").read_text()
)
PROMPTS = [
    "What is the current git branch? Run git to find out.",
    "Search the code for 'TODO' comments.",
    "List every Markdown file under the docs folder.",
]
# A JSON call, as small models write them in text: its name, then its arguments opening.
CALL_SHAPE = re.compile(r'"name"\s*:\s*"([^"]*)"\s*,\s*"(?:arguments|parameters)"\s*:\s*\{')


def test_every_call_a_coder_model_starts_names_an_offered_tool(coder: Server) -> None:
    claude = SUITE["claude"]
    schemas = {tool["name"]: tool["input_schema"] for tool in claude["tools"]}
    called = 0
    for prompt in PROMPTS:
        body = {
            "model": "claude-x",
            "max_tokens": 256,
            "temperature": 0,
            "system": claude["system"],
            "tools": claude["tools"],
            "messages": [{"role": "user", "content": prompt}],
        }
        answer = httpx.post(f"{coder.url}/v1/messages", json=body, timeout=600).json()
        for block in answer["content"]:
            if block["type"] == "tool_use":
                called += 1
                jsonschema.validate(block["input"], schemas[block["name"]])
            else:
                made_up = [
                    name for name in CALL_SHAPE.findall(block["text"]) if name not in schemas
                ]
                assert not made_up, (prompt, block["text"], coder.log())
    assert called, coder.log()
