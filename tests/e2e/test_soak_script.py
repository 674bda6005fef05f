"""benchmarks/soak.py works: a few seconds of it against the fake-runner app over HTTP (both
SDKs, streamed and not, abandoned streams, agent deletes) report no error and no held block;
and it refuses a server that is not on this machine. The real soak runs on the real model."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from semantic.text.tokenizer import Tokenizer
from tests.e2e.fake_server import fake_server

pytestmark = pytest.mark.e2e

SOAK = Path(__file__).parents[2] / "benchmarks" / "soak.py"


def soak(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, str(SOAK), *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=cwd)


def test_a_short_soak_reports_every_mode_and_no_errors_or_leaks(
    tiny_tokenizer: Tokenizer, tmp_path: Path
) -> None:
    report_path = tmp_path / "soak.json"
    # Room for the agents' system prompts, which the tiny tokenizer splits finely.
    with fake_server(tiny_tokenizer, tmp_path / "cache", context=4096, num_blocks=1024) as url:
        run = soak(
            *("--base-url", url, "--minutes", "0.05", "--agents", "8", "--turns", "3"),
            *("--max-tokens", "8", "--abandon-every", "2", "--json", str(report_path)),
            *("--markdown", str(tmp_path / "soak.md")),
            cwd=tmp_path,
        )
    assert run.returncode == 0, run.stdout + run.stderr
    report = json.loads(report_path.read_text())
    modes = {"openai json", "openai stream", "anthropic json", "anthropic stream"}
    assert set(report["turns_by_mode"]) == modes
    assert report["errors"] == {} and report["leaked_blocks"] == 0
    assert report["abandoned_streams"] > 0 and report["agents"]["deleted"] > 0
    assert report["output_tokens"] > 0
    assert "KV blocks held after idle" in (tmp_path / "soak.md").read_text()


@pytest.mark.parametrize("url", ["http://10.1.2.3:8000", "http://example.com:8000"])
def test_the_soak_refuses_a_server_elsewhere(url: str, tmp_path: Path) -> None:
    run = soak("--base-url", url, "--minutes", "0.05", cwd=tmp_path)
    assert run.returncode != 0 and "not a loopback address" in run.stderr
