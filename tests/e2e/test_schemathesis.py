"""Schemathesis against the server's own /openapi.json: requests generated from the document,
valid and invalid, to every operation of a real HTTP server (uvicorn, in this process, on the
fake runner: generation is instant, so any `max_tokens` is cheap). No answer may be a 5xx, and
every answer must be one the document promises: its status, content type and schema (each SSE
event included).

Schemathesis runs through its command line (`st run`), its stable interface, bounded for CI
(`MAX_EXAMPLES` per operation, a fixed seed). For a deeper run against a real server:
`st run http://127.0.0.1:8000/openapi.json --checks all --max-examples 500`.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from semantic.text.tokenizer import Tokenizer
from tests.e2e.fake_server import fake_server

pytestmark = pytest.mark.e2e

MAX_EXAMPLES = 20
KEY = "sk-semantic-fuzz-5e6f"
SEED = 20260504
CHECKS = (
    "not_a_server_error",
    "status_code_conformance",
    "content_type_conformance",
    "response_schema_conformance",
)


@pytest.fixture(scope="module")
def base_url(tiny_tokenizer: Tokenizer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with fake_server(tiny_tokenizer, tmp_path_factory.mktemp("cache")) as url:
        yield url


def test_the_document_lists_the_routes_it_fuzzes(base_url: str) -> None:
    """Guards the fuzz against passing vacuously on an empty document."""
    paths = httpx.get(f"{base_url}/openapi.json").json()["paths"]
    assert {"/v1/messages", "/v1/chat/completions", "/v1/completions", "/v1/agents"} <= set(paths)


def schemathesis_run(url: str, workdir: Path, *extra: str) -> None:
    """`st run` on the server's document; fails the test with its report if it found anything."""
    command = [
        *(sys.executable, "-m", "schemathesis.cli", "run", f"{url}/openapi.json"),
        *("--checks", ",".join(CHECKS), "--mode", "all", "--seed", str(SEED)),
        *("--phases", "examples,coverage,fuzzing", "--workers", "1"),
        *("--request-timeout", "60", "--report-dir", str(workdir), *extra),
    ]
    run = subprocess.run(command, capture_output=True, text=True, timeout=900, cwd=workdir)
    assert run.returncode == 0, run.stdout[-20000:] + run.stderr[-5000:]


def test_no_server_errors_and_every_answer_as_documented(base_url: str, tmp_path: Path) -> None:
    schemathesis_run(base_url, tmp_path, "--max-examples", str(MAX_EXAMPLES))


def test_401_and_429_are_answered_as_documented(tiny_tokenizer: Tokenizer, tmp_path: Path) -> None:
    """With API keys and a key rate limit, the document lists 401 and 429, and the server
    answers them in the documented shapes (the budget runs out early in the run)."""
    limited = fake_server(tiny_tokenizer, tmp_path / "cache", api_key=[KEY], rate_limit_key_rpm=60)
    with limited as url:
        schemathesis_run(url, tmp_path, "--max-examples", "5", "--header", f"x-api-key: {KEY}")
