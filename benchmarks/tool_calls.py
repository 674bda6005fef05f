"""How often a served model's answers become tool calls an agent can run: a fixed set of prompts
that need a tool and prompts that need none, with Claude Code's tool set (through the Anthropic
Messages API) and Codex's (through the Responses API).

    python benchmarks/tool_calls.py --model qwen2.5-coder-0.5b [--json out.json]
    python benchmarks/tool_calls.py --base-url http://127.0.0.1:8000   # a server already running

A prompt that needs a tool scores a *valid call* when the answer's first call names an offered
tool and its arguments match that tool's schema (and *the right tool* when it is the one the
prompt asks for); one that needs none scores a *false call* when the answer calls anything. The
prompts go out `--concurrency` at a time, greedy: the server decodes them in one batch, which on
a CPU costs about what one does, and a batched answer is the one it gets alone.

The tool sets carry the clients' real tool names and argument schemas as captured from their
first requests (Claude Code 2.1.197's 24 tools: `Agent` for subagents, `TaskCreate` for the task
list, no `Glob` or `Grep`, searches going through Bash; Codex 0.171 as it sends them for a model
it does not know: `exec_command` and `write_stdin` for the shell and no `apply_patch` tool,
files being changed through the shell), the schemas' prose replaced by short descriptions of
our own; `tool_call_prompts.json` beside this file holds the system prompts and the prompts.
The answers get 256 tokens: room for a whole call, pretty-printed with every optional argument
(at 96, the 1.5B's well-begun task-list and plan calls were cut off in their lists).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
import jsonschema

from semantic_bench.server import SpawnedServer

PROMPTS = Path(__file__).with_name("tool_call_prompts.json")


@dataclass(slots=True)
class Answer:
    client: str  # claude | codex
    prompt: str
    expected: str | None  # the tool the prompt asks for; None: it needs none
    calls: list[dict[str, Any]]  # {"name", "arguments"} of each call, in order
    text: str
    seconds: float
    error: str = ""

    @property
    def valid(self) -> bool:
        return bool(self.calls) and self.calls[0].get("valid", False)

    @property
    def right_tool(self) -> bool:
        return self.valid and self.calls[0]["name"] == self.expected


def main() -> int:
    args = _parser().parse_args()
    suite = json.loads(PROMPTS.read_text())
    if args.base_url:
        answers = asyncio.run(_ask_all(args.base_url, suite, args))
    else:
        with tempfile.TemporaryDirectory(prefix="tool-calls-") as scratch:
            server = SpawnedServer.start(args.model, args.server_arg, Path(scratch) / "cache")
            try:
                server.wait_ready(args.ready_timeout)
                answers = asyncio.run(_ask_all(server.base_url, suite, args))
            finally:
                server.stop()
    summary = _summary(answers)
    print(_table(args.label or args.model or args.base_url, summary))
    if args.json:
        report = {"summary": summary, "answers": [asdict(a) for a in answers]}
        Path(args.json).write_text(json.dumps(report, indent=2))
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--model", default="qwen2.5-coder-0.5b", help="served by a new server")
    parser.add_argument("--base-url", help="ask this server instead of starting one")
    parser.add_argument("--server-arg", action="append", default=[], help="passed to serve")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--only", choices=("claude", "codex"), help="one client's prompts")
    parser.add_argument("--limit", type=int, help="the first N prompts of each kind")
    parser.add_argument("--label", help="the table's heading")
    parser.add_argument("--ready-timeout", type=float, default=600.0)
    parser.add_argument("--json", help="also write every answer here")
    return parser


async def _ask_all(base_url: str, suite: dict[str, Any], args: argparse.Namespace) -> list[Answer]:
    cases = [
        (client, case["prompt"], case.get("tool"))
        for client in ("claude", "codex")
        if args.only in (None, client)
        for kind in ("needs_tool", "needs_none")
        for case in suite[client][kind][: args.limit]
    ]
    gate = asyncio.Semaphore(args.concurrency)
    async with httpx.AsyncClient(base_url=base_url, timeout=3600) as http:
        # One request first: every later prompt reads the system prompt and tools from cache.
        first = await _ask(http, suite, *cases[0], args.max_tokens)
        rest = [_gated(gate, _ask(http, suite, *case, args.max_tokens)) for case in cases[1:]]
        return [first, *await asyncio.gather(*rest)]


async def _gated(gate: asyncio.Semaphore, work: Any) -> Answer:
    async with gate:
        return await work


async def _ask(
    http: httpx.AsyncClient,
    suite: dict[str, Any],
    client: str,
    prompt: str,
    expected: str | None,
    max_tokens: int,
) -> Answer:
    tools = suite[client]["tools"]
    functions = [inner for tool in tools for inner in tool.get("tools", [tool])]  # namespaces
    schemas = {f["name"]: f.get("input_schema") or f.get("parameters") for f in functions}
    started = time.perf_counter()
    if client == "claude":
        body = {
            "model": "claude-sonnet-4-6",
            "max_tokens": max_tokens,
            "temperature": 0,
            "system": suite[client]["system"],
            "tools": tools,
            "messages": [{"role": "user", "content": prompt}],
        }
        response = await http.post("/v1/messages", json=body)
    else:
        body = {
            "model": "gpt-5-codex",
            "max_output_tokens": max_tokens,
            "temperature": 0,
            "store": False,
            "tools": tools,
            "input": [
                {"role": "developer", "content": suite[client]["system"]},
                {"role": "user", "content": prompt},
            ],
        }
        response = await http.post("/v1/responses", json=body)
    seconds = round(time.perf_counter() - started, 1)
    if response.status_code != 200:
        return Answer(client, prompt, expected, [], "", seconds, response.text[:300])
    calls, text = _calls_and_text(client, response.json())
    for call in calls:
        call["valid"] = call["name"] in schemas and _matches(
            call["arguments"], schemas[call["name"]]
        )
    return Answer(client, prompt, expected, calls, text, seconds)


def _calls_and_text(client: str, reply: dict[str, Any]) -> tuple[list[dict[str, Any]], str]:
    if client == "claude":
        blocks = reply["content"]
        calls = [
            {"name": b["name"], "arguments": b["input"]} for b in blocks if b["type"] == "tool_use"
        ]
        text = "".join(b.get("text", "") for b in blocks if b["type"] == "text")
        return calls, text
    calls, text = [], ""
    for item in reply["output"]:
        if item["type"] == "function_call":
            calls.append({"name": item["name"], "arguments": _json_or_text(item["arguments"])})
        elif item["type"] == "message":
            text += "".join(part.get("text", "") for part in item["content"])
    return calls, text


def _json_or_text(arguments: str) -> Any:
    try:
        return json.loads(arguments)
    except json.JSONDecodeError:
        return arguments


def _matches(arguments: Any, schema: dict[str, Any] | None) -> bool:
    try:
        jsonschema.validate(arguments, schema or {"type": "object"})
    except jsonschema.ValidationError:
        return False
    return True


def _summary(answers: list[Answer]) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for client in sorted({a.client for a in answers}):
        mine = [a for a in answers if a.client == client]
        needs = [a for a in mine if a.expected is not None]
        none = [a for a in mine if a.expected is None]
        summary[client] = {
            "needs_tool": len(needs),
            "valid_calls": sum(a.valid for a in needs),
            "right_tool": sum(a.right_tool for a in needs),
            "broken_calls": sum(bool(a.calls) and not a.valid for a in needs),
            "needs_none": len(none),
            "false_calls": sum(bool(a.calls) for a in none),
            "errors": sum(bool(a.error) for a in mine),
            "median_seconds": sorted(a.seconds for a in mine)[len(mine) // 2] if mine else 0,
        }
    return summary


def _table(label: str, summary: dict[str, Any]) -> str:
    lines = [
        f"### {label}",
        "",
        "| client | needs a tool | valid calls | right tool | broken calls | needs none "
        "| false calls | errors |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for client, s in summary.items():
        n = max(s["needs_tool"], 1)
        lines.append(
            f"| {client} | {s['needs_tool']} | {s['valid_calls']} ({s['valid_calls'] / n:.0%}) "
            f"| {s['right_tool']} ({s['right_tool'] / n:.0%}) | {s['broken_calls']} "
            f"| {s['needs_none']} | {s['false_calls']} | {s['errors']} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
