"""What `semantic serve` says while it starts, off a terminal: each load phase with its
duration, then one line that says where it serves and how much the KV pool holds."""

from __future__ import annotations

import json
import re

import httpx
import pytest

from tests.e2e.conftest import Server

pytestmark = pytest.mark.e2e


def test_the_load_logs_its_phases_and_one_ready_line(server: Server) -> None:
    events = []
    for line in server.log_path.read_text().splitlines():
        try:
            events.append(json.loads(line)["event"])
        except (ValueError, KeyError):
            continue  # a line not of our logger's
    for phase in (
        r"read the config and tokenizer in \d+\.\d s",
        r"weights: \d+ tensors read and converted in \d+\.\d s",
        r"loaded smollm2-135m in \d+\.\d s",
    ):
        assert any(re.fullmatch(phase, event) for event in events), phase
    ready = [e for e in events if e.startswith("ready on ")]
    assert len(ready) == 1
    said = re.fullmatch(
        r"ready on (http://127\.0\.0\.1:\d+) \(\d+\.\d s to load\) — ([\d,]+) KV blocks "
        r"\(~([\d,]+) tokens\); API at \1/docs",
        ready[0],
    )
    assert said is not None and said.group(1) == server.url
    assert httpx.get(f"{server.url}/").json()["model"] == "smollm2-135m"
