"""The real Claude Code CLI against `semantic serve` on this machine: two turns of one session
in print mode (`claude -p …`, then `claude -p --continue …`). Both must exit 0 with text, and
the second must read at least `--min-cached` prompt tokens from the server's cache.

    python benchmarks/claude_code_check.py [--claude PATH] [--model gemma3-270m] [--json out.json]

Without `--claude`, installs `@anthropic-ai/claude-code` with npm into a throwaway folder. The
CLI runs with a throwaway HOME and only these variables (so it talks to the loopback server and
nothing else): CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC, DISABLE_TELEMETRY,
DISABLE_ERROR_REPORTING, DISABLE_AUTOUPDATER, ANTHROPIC_BASE_URL, a dummy ANTHROPIC_API_KEY, and
CLAUDE_CODE_MAX_OUTPUT_TOKENS (a small model may not stop by itself: what is checked is the
protocol and the cache, not the answers). A first turn of ~13K tokens (~20K in Gemma's
tokenizer) takes minutes on a 2-core CPU: this is a script, not part of the test suite.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from semantic.bench.server import SpawnedServer

FIRST = "In one short sentence: what is this folder for?"
SECOND = "Now say that again in five words."


def main() -> int:
    args = _parser().parse_args()
    with tempfile.TemporaryDirectory(prefix="claude-code-check-") as scratch:
        root = Path(scratch)
        claude = args.claude or _install_claude(root / "npm")
        server = SpawnedServer.start(args.model, args.server_arg, root / "cache")
        try:
            server.wait_ready(args.ready_timeout)
            result = _two_turns(claude, server.base_url, root, args)
        finally:
            server.stop()
    print(json.dumps(result, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0 if result["passed"] else 1


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--claude", help="the claude executable (default: npm install one)")
    parser.add_argument("--model", default="gemma3-270m")
    parser.add_argument("--max-output-tokens", type=int, default=48)
    parser.add_argument("--min-cached", type=int, default=10_000)
    parser.add_argument("--turn-timeout", type=float, default=1800.0)
    parser.add_argument("--ready-timeout", type=float, default=600.0)
    parser.add_argument("--server-arg", action="append", default=[], help="passed to serve")
    parser.add_argument("--json", help="also write the result here")
    return parser


def _install_claude(folder: Path) -> str:
    npm = shutil.which("npm")
    if npm is None:
        raise SystemExit("npm is not installed; pass --claude")
    folder.mkdir(parents=True)
    command = [npm, "install", "--prefix", str(folder), "@anthropic-ai/claude-code"]
    subprocess.run(command, check=True, capture_output=True)
    return str(folder / "node_modules" / ".bin" / "claude")


def _two_turns(claude: str, base_url: str, root: Path, args: argparse.Namespace) -> dict[str, Any]:
    home, work = root / "home", root / "work"
    home.mkdir()
    work.mkdir()
    (work / "README.md").write_text("# notes\nA folder of notes about lighthouses.\n")
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": str(home),
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_TELEMETRY": "1",
        "DISABLE_ERROR_REPORTING": "1",
        "DISABLE_AUTOUPDATER": "1",
        "ANTHROPIC_BASE_URL": base_url,
        "ANTHROPIC_API_KEY": "sk-ant-dummy-for-a-local-server",
        "CLAUDE_CODE_MAX_OUTPUT_TOKENS": str(args.max_output_tokens),
    }
    turns = []
    for prompt, extra in ((FIRST, []), (SECOND, ["--continue"])):
        before = _hit_tokens(base_url)
        started = time.perf_counter()
        done = subprocess.run(
            [claude, "-p", *extra, prompt],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
            timeout=args.turn_timeout,
        )
        turns.append(
            {
                "command": ["claude", "-p", *extra, prompt],
                "exit_code": done.returncode,
                "seconds": round(time.perf_counter() - started, 1),
                "text": done.stdout.strip()[:500],
                "stderr": done.stderr.strip()[-500:],
                "cached_prompt_tokens": _hit_tokens(base_url) - before,
            }
        )
    passed = all(t["exit_code"] == 0 and t["text"] for t in turns)
    passed = passed and turns[1]["cached_prompt_tokens"] >= args.min_cached
    return {"model": args.model, "passed": passed, "turns": turns}


def _hit_tokens(base_url: str) -> int:
    """Prompt tokens the server has served from its cache so far (memory and disk)."""
    totals = httpx.get(f"{base_url}/admin/cache", timeout=30).json()["totals"]
    return int(totals["hit_tokens_memory"]) + int(totals["hit_tokens_disk"])


if __name__ == "__main__":
    sys.exit(main())
