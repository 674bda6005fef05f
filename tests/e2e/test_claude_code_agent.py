"""The real Claude Code CLI runs a read-and-report task on a real coder model, `qwen2.5-coder-0.5b`,
and the server carries the agent's loop: the model's reply becomes a Read call the CLI runs
(parsed from whatever shape the model wrote and held to the tool's schema), the file's text goes
back in the next request, and that request reads all of the first request's prompt from the
cache (what is new is the call and the file's text: ~130 tokens, a tenth of --bare's short
prompt). No answer is a 5xx.

Whether the model then reports the code word is the model's part: the 0.5B reads the file and
then calls Read or Edit again instead of answering (docs/clients.md keeps its task table), so
this test does not ask for the word. It runs Claude Code's `--bare` mode, whose ~1,070-token
first request a 2-core CPU prefills in seconds (the full prompt is ~19,000 tokens: minutes),
and caps the session at two model turns.

The CLI comes from npm (`@anthropic-ai/claude-code`, into a folder of this test session) unless
`SEMANTIC_CLAUDE` names one; the test is skipped, saying why, where npm, the CLI or the model's
packages are missing. It runs the CLI with a throwaway HOME and nonessential traffic off,
against the loopback server only.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import Server

pytestmark = pytest.mark.e2e

CODE_WORD = "PELICAN-7"
TASK = "Read the file secret.txt and tell me the code word in it."


@pytest.fixture(scope="module")
def claude(tmp_path_factory: pytest.TempPathFactory) -> str:
    given = os.environ.get("SEMANTIC_CLAUDE")
    if given:
        return given
    npm = shutil.which("npm")
    if npm is None:
        pytest.skip("needs npm to install the Claude Code CLI (or SEMANTIC_CLAUDE=path/to/claude)")
    folder = tmp_path_factory.mktemp("claude-cli")
    command = [npm, "install", "--prefix", str(folder), "@anthropic-ai/claude-code"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    cli = folder / "node_modules" / ".bin" / "claude"
    if done.returncode != 0 or not cli.exists():
        pytest.skip(f"npm could not install the Claude Code CLI: {done.stderr[-300:]}")
    return str(cli)


def test_claude_code_reads_a_file_through_a_call_the_server_parsed(
    claude: str, coder: Server, tmp_path: Path
) -> None:
    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir()
    home.mkdir()
    (work / "secret.txt").write_text(f"The code word is {CODE_WORD}.\n")
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_TELEMETRY": "1",
        "DISABLE_ERROR_REPORTING": "1",
        "DISABLE_AUTOUPDATER": "1",
        "ANTHROPIC_BASE_URL": coder.url,
        "ANTHROPIC_API_KEY": "sk-ant-dummy-for-a-local-server",
        # A call is ~35 tokens and the answer fewer; a small model can ramble far longer.
        "CLAUDE_CODE_MAX_OUTPUT_TOKENS": "128",
    }
    command = [claude, "-p", "--bare", "--max-turns", "2", "--allowedTools=Read", TASK]
    done = subprocess.run(
        command, cwd=work, env=env, capture_output=True, text=True, timeout=1200,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    said = done.stdout[-1000:] + done.stderr[-1000:]
    assert done.returncode == 0 or "max turns" in said, (said, coder.log())
    assert 'HTTP/1.1\\" 5' not in coder.log_path.read_text()  # no 5xx answer, in the access log

    replies, results = _transcript(home)
    first = replies[0]["content"]
    read = next(block for block in first if block["type"] == "tool_use")
    assert read["name"] == "Read", first
    # The model's choice of path varies (the file, `secrets.txt`, the folder itself): a path
    # in the working folder, which the CLI tells it.
    assert read["input"]["file_path"].startswith(str(work)), read
    result = next(block for block in results[0] if block["type"] == "tool_result")
    assert result["tool_use_id"] == read["id"]  # the CLI ran the call and sent its result back
    first_usage, usage = replies[0]["usage"], replies[1]["usage"]
    fields = ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
    first_prompt = sum(first_usage[field] for field in fields)
    assert usage["cache_read_input_tokens"] >= first_prompt, (first_usage, usage)


def _transcript(home: Path) -> tuple[list[dict[str, Any]], list[list[dict[str, Any]]]]:
    """The session's model replies (each with its `usage` and all its blocks) and the tool
    results sent back, in order, from the transcript Claude Code writes under HOME (one entry
    per block of a reply, each carrying the reply's id)."""
    (path,) = (home / ".claude" / "projects").glob("*/*.jsonl")
    replies: dict[str, dict[str, Any]] = {}
    results = []
    for line in path.read_text().splitlines():
        entry = json.loads(line)
        message = entry.get("message") or {}
        content = message.get("content")
        if entry.get("type") == "assistant":
            reply = replies.setdefault(message["id"], message | {"content": []})
            reply["content"] += content
        elif entry.get("type") == "user" and isinstance(content, list):
            results.append(content)
    return list(replies.values()), results
