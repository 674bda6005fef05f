"""Real coding agents doing real tasks against `semantic serve`: the Claude Code and Codex CLIs in
print mode (`claude -p`, `codex exec`), each task in a fresh folder, its effect checked here
(a file's bytes, the reported output), and where each turn's time went.

    python benchmarks/agent_tasks.py --model qwen2.5-coder-0.5b [--client claude --client codex]
        [--task read ...] [--json out.json] [--markdown table.md]

The tasks: read a file and report a word in it; create a file; edit one line; run a command and
report its output; and a session of three turns (`--continue` / `codex exec resume --last`).
With `--bare`, Claude Code runs in its minimal mode (`claude --bare`: a one-line system prompt,
the working folder and date, and three tools, Bash, Edit and Read: ~1K tokens where the full
prompt is ~19K). With `--claude-tools Bash,Read,Edit,Write`, Claude Code keeps its full system
prompt but offers only those tools (`claude --tools`): ~3.3K tokens, most of the ~19K being
the definitions of the tools a small model does not need. With `--codex-lean`, Codex reads the
served model's metadata from `codex_models.json` beside this file (short instructions of our own,
its 32K context) and leaves out what a small model does not need (sub-agents, images, goals,
web search, questions to the user, the list of skills): ~1K tokens where its default is ~8.7K,
and two tools, `exec_command` and `write_stdin`. Measured on the 1.5B it is several times as
fast and finishes fewer tasks (docs/clients.md, "Codex lean"). The server logs at debug level, so
each turn also records what the model wrote (`replies`) and how many calls were read from it,
and the made-up tool names it wrote again as calls of offered tools (`renamed`).
Each turn reports its wall time split into the first request's time to its first token (a
long prefill: the CLIs' system prompts and tools are ~9K–19K tokens), the later requests' time
to first token, their decoding, and the rest (the CLI running tools and itself); and each
request's share of its prompt read from the cache. Both CLIs are installed with npm into a
throwaway folder unless `--claude` / `--codex` name them; they run with a throwaway HOME,
nonessential traffic off, against the loopback server only (Codex without its sandbox, which
needs bubblewrap, in the task's own throwaway folder).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from semantic_bench.server import SpawnedServer

Check = Callable[[Path, str], bool]  # (the task's folder, the CLI's output) -> done?
# The tools Claude Code may use without asking (print mode cannot ask; its flag that skips
# every question is refused to root).
CLAUDE_TOOLS = "--allowedTools=Bash,Read,Write,Edit,Glob,Grep"
MAX_OUTPUT_TOKENS = 512  # a reply's cap: Claude Code's by its setting, Codex's by the server's
CODEX_MODELS = Path(__file__).with_name("codex_models.json")
# Codex's settings that leave out the tools a small model does not need (`--codex-lean`).
CODEX_LEAN = """web_search = "disabled"

[features]
multi_agent = false
view_image = false
goals = false
default_mode_request_user_input = false

[tools.experimental_request_user_input]
enabled = false

[skills]
include_instructions = false
"""


@dataclass(slots=True, frozen=True)
class Task:
    name: str
    files: dict[str, str]  # what the folder holds before the first turn
    turns: tuple[str, ...]
    check: Check


def _file_is(name: str, text: str) -> Check:
    return lambda folder, _: (
        (folder / name).is_file() and (folder / name).read_text().strip() == text
    )


def _says(word: str) -> Check:
    return lambda _, output: word.lower() in output.lower()


TASKS = (
    Task(
        "read",
        {"secret.txt": "The code word is PELICAN-7.\n"},
        ("Read the file secret.txt and tell me the code word in it.",),
        _says("PELICAN-7"),
    ),
    Task(
        "create",
        {},
        ("Create a file named out.txt containing exactly: 42",),
        _file_is("out.txt", "42"),
    ),
    Task(
        "edit",
        {"config.py": "NAME = 'demo'\nDEBUG = True\nPORT = 8080\n"},
        ("In config.py, change the line DEBUG = True to DEBUG = False. Change nothing else.",),
        lambda folder, _: (
            (folder / "config.py").read_text() == "NAME = 'demo'\nDEBUG = False\nPORT = 8080\n"
        ),
    ),
    Task(
        "run",
        {"zebra-4417.txt": "", "notes.md": "# notes\n"},
        ("Run the command `ls` in this folder and tell me the names of the files it lists.",),
        _says("zebra-4417"),
    ),
    Task(
        "session",
        {"motto.txt": "Lighthouses never sleep.\n"},
        (
            "Read motto.txt and tell me its first word.",
            "Now create a file named copy.txt containing only that word.",
            "What is in copy.txt now? Read it and tell me.",
        ),
        lambda folder, output: (
            _file_is("copy.txt", "Lighthouses")(folder, output)
            and _says("Lighthouses")(folder, output)
        ),
    ),
)


@dataclass(slots=True)
class Turn:
    client: str
    task: str
    turn: int
    exit_code: int
    seconds: float
    output: str
    requests: list[dict[str, Any]] = field(default_factory=list)
    replies: list[tuple[int, str]] = field(default_factory=list)  # (calls read, text) each
    renamed: list[str] = field(default_factory=list)  # made-up tool names written again

    def split(self) -> dict[str, float]:
        """Where the turn's wall time went (seconds)."""
        first = [r.get("first_token_s") or r["seconds"] for r in self.requests]
        decode = sum(r["seconds"] - (r.get("first_token_s") or r["seconds"]) for r in self.requests)
        served = sum(r["seconds"] for r in self.requests)
        return {
            "first_prefill": round(first[0], 1) if first else 0.0,
            "later_prefills": round(sum(first[1:]), 1),
            "decode": round(decode, 1),
            "client_and_tools": round(max(self.seconds - served, 0.0), 1),
        }


def main() -> int:
    args = _parser().parse_args()
    tasks = [task for task in TASKS if not args.task or task.name in args.task]
    results: dict[str, Any] = {
        "model": args.model,
        "bare": args.bare,
        "claude_tools": args.claude_tools,
        "codex_lean": args.codex_lean,
        "tasks": [],
    }
    with tempfile.TemporaryDirectory(prefix="agent-tasks-") as scratch:
        root = Path(scratch)
        cache = Path(args.cache_dir) if args.cache_dir else root / "cache"
        server_args = [
            f"--default-max-tokens={MAX_OUTPUT_TOKENS}",
            "--log-level=debug",  # each reply's text, for the record of what the model wrote
            *args.server_arg,
        ]
        server = SpawnedServer.start(args.model, server_args, cache)
        try:
            server.wait_ready(args.ready_timeout)
            for client in args.client or ["claude"]:
                cli = _cli(client, args, root)
                for task in tasks:
                    results["tasks"].append(_run(client, cli, task, server, root, args))
                    print(json.dumps(results["tasks"][-1]["summary"]), flush=True)
        finally:
            server.stop()
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    table = _table(results)
    print(table)
    if args.markdown:
        Path(args.markdown).write_text(table + "\n")
    return 0 if all(t["summary"]["passed"] for t in results["tasks"]) else 1


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--model", default="qwen2.5-coder-0.5b")
    parser.add_argument("--client", action="append", choices=("claude", "codex"))
    parser.add_argument("--task", action="append", choices=[t.name for t in TASKS])
    parser.add_argument("--claude", help="the claude executable (default: npm install one)")
    parser.add_argument("--codex", help="the codex executable (default: npm install one)")
    parser.add_argument("--bare", action="store_true", help="run Claude Code with --bare")
    parser.add_argument("--claude-tools", help="the tools Claude Code offers (its --tools)")
    parser.add_argument(
        "--codex-lean", action="store_true", help="Codex with semantic's model metadata, two tools"
    )
    parser.add_argument("--turn-timeout", type=float, default=3600.0)
    parser.add_argument("--ready-timeout", type=float, default=600.0)
    parser.add_argument("--server-arg", action="append", default=[], help="passed to serve")
    parser.add_argument("--cache-dir", help="the server's (default: a throwaway folder)")
    parser.add_argument("--json", help="also write every turn here")
    parser.add_argument("--markdown", help="also write the table here")
    return parser


def _cli(client: str, args: argparse.Namespace, root: Path) -> str:
    given = args.claude if client == "claude" else args.codex
    if given:
        return str(given)
    npm = shutil.which("npm")
    if npm is None:
        raise SystemExit(f"npm is not installed; pass --{client}")
    package = "@anthropic-ai/claude-code" if client == "claude" else "@openai/codex"
    folder = root / "npm" / client
    folder.mkdir(parents=True)
    subprocess.run(
        [npm, "install", "--prefix", str(folder), package], check=True, capture_output=True
    )
    return str(folder / "node_modules" / ".bin" / client)


def _run(
    client: str, cli: str, task: Task, server: SpawnedServer, root: Path, args: argparse.Namespace
) -> dict[str, Any]:
    folder, home = root / client / task.name / "work", root / client / task.name / "home"
    folder.mkdir(parents=True)
    home.mkdir(parents=True)
    for name, text in task.files.items():
        (folder / name).write_text(text)
    env = _environment(client, home, server.base_url, args.codex_lean)
    turns = []
    for i, prompt in enumerate(task.turns):
        logged = len(_logged(server, "request finished"))
        replied = len(_logged(server, "reply"))
        renamed = len(_logged(server, "call renamed"))
        started = time.perf_counter()
        exit_code, output = _cli_turn(_command(client, cli, prompt, i > 0, args), folder, env, args)
        seconds = round(time.perf_counter() - started, 1)
        turn = Turn(client, task.name, i + 1, exit_code, seconds, output[-2000:])
        turn.requests = [_request(r) for r in _logged(server, "request finished")[logged:]]
        turn.replies = [(r["calls"], r["text"]) for r in _logged(server, "reply")[replied:]]
        turn.renamed = [r["tool"] for r in _logged(server, "call renamed")[renamed:]]
        turns.append(turn)
    outputs = "\n".join(t.output for t in turns)
    passed = all(t.exit_code == 0 for t in turns) and task.check(folder, outputs)
    return {
        "summary": {"client": client, "task": task.name, "passed": passed},
        "turns": [asdict(t) | {"split": t.split()} for t in turns],
    }


def _cli_turn(
    command: list[str], folder: Path, env: dict[str, str], args: argparse.Namespace
) -> tuple[int, str]:
    """The CLI's exit code and what it printed; a turn past `--turn-timeout` is killed and
    counts as failed (exit code -1), so that one slow turn does not lose the others."""
    try:
        done = subprocess.run(
            command,
            cwd=folder,
            env=env,
            capture_output=True,
            text=True,
            timeout=args.turn_timeout,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired as timed_out:
        printed = timed_out.stdout or ""
        text = printed.decode(errors="replace") if isinstance(printed, bytes) else printed
        return -1, f"{text.strip()}\n[killed after {args.turn_timeout:g} s]".strip()
    return done.returncode, done.stdout.strip()


def _environment(client: str, home: Path, base_url: str, lean: bool) -> dict[str, str]:
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": str(home),
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_TELEMETRY": "1",
        "DISABLE_ERROR_REPORTING": "1",
        "DISABLE_AUTOUPDATER": "1",
    }
    if client == "claude":
        return env | {
            "ANTHROPIC_BASE_URL": base_url,
            "ANTHROPIC_API_KEY": "sk-ant-dummy-for-a-local-server",
            # A small model can ramble for thousands of tokens, at a few a second on a CPU.
            "CLAUDE_CODE_MAX_OUTPUT_TOKENS": str(MAX_OUTPUT_TOKENS),
        }
    codex_home = home / ".codex"
    codex_home.mkdir()
    catalog = f'model_catalog_json = "{CODEX_MODELS}"\n' if lean else ""
    (codex_home / "config.toml").write_text(
        f'model = "qwen2.5-coder"\n{catalog}model_provider = "semantic"\n'
        "model_context_window = 32768\nmodel_auto_compact_token_limit = 28000\n"
        + (CODEX_LEAN if lean else "")
        + "\n[model_providers.semantic]\n"
        f'name = "semantic"\nbase_url = "{base_url}/v1"\nwire_api = "responses"\n'
    )
    return env | {"CODEX_HOME": str(codex_home)}


def _command(
    client: str, cli: str, prompt: str, later: bool, args: argparse.Namespace
) -> list[str]:
    if client == "claude":
        return [
            cli,
            "-p",
            *(["--continue"] if later else []),
            *(["--bare"] if args.bare else []),
            *([f"--tools={args.claude_tools}"] if args.claude_tools else []),
            CLAUDE_TOOLS,
            prompt,
        ]
    bypass = ["--dangerously-bypass-approvals-and-sandbox", "--skip-git-repo-check"]
    return [cli, "exec", *(["resume", "--last"] if later else []), *bypass, prompt]


def _logged(server: SpawnedServer, event: str) -> list[dict[str, Any]]:
    """The server's log lines of `event` so far, oldest first."""
    server.log.flush()
    server.log.seek(0)
    lines = server.log.read().decode(errors="replace").splitlines()
    server.log.seek(0, 2)
    marker = json.dumps({"event": event})[1:-1]
    return [json.loads(line) for line in lines if marker in line]


def _request(record: dict[str, Any]) -> dict[str, Any]:
    keys = ("prompt_tokens", "cached_tokens", "output_tokens", "first_token_s", "seconds")
    return {key: record.get(key) for key in keys}


def _table(results: dict[str, Any]) -> str:
    modes = ["--bare"] if results["bare"] else []
    if results.get("claude_tools"):
        modes.append(f"--tools={results['claude_tools']}")
    claude = f" (Claude Code with {' and '.join(modes)})" if modes else ""
    lean = results.get("codex_lean")
    codex = " (Codex lean: semantic's model metadata, two tools)" if lean else ""
    lines = [
        f"Model: `{results['model']}`{claude}{codex}.",
        "",
        "| client | task | turn | done | wall s | first prefill s | later prefills s | decode s "
        "| client and tools s | requests | prompt read from cache |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for task in results["tasks"]:
        for turn in task["turns"]:
            split = turn["split"]
            shares = [
                f"{r['cached_tokens'] / r['prompt_tokens']:.0%} of {r['prompt_tokens']:,}"
                for r in turn["requests"]
                if r["prompt_tokens"]
            ]
            done = "yes" if task["summary"]["passed"] else "no"
            lines.append(
                f"| {turn['client']} | {turn['task']} | {turn['turn']} | {done} "
                f"| {turn['seconds']} | {split['first_prefill']} | {split['later_prefills']} "
                f"| {split['decode']} "
                f"| {split['client_and_tools']} | {len(turn['requests'])} | {'; '.join(shares)} |"
            )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
