"""The docs' curl examples run as written, in the order a reader meets them, against one
server: none fails, and none collides with another (an agent one creates is not one an earlier
example already made); nor does an agent the SDK examples name."""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from semantic.models.served import ServedModel
from tests.unit.fakes import chat_app

DOCS = Path(__file__).parents[2] / "docs"
# (page, the heading of the section whose shell blocks run), in the order a reader meets them.
SECTIONS = [
    ("clients.md", "## curl"),
    ("clients.md", "## The agent API"),
    ("first-agent.md", "## 4. Your own agents"),
]


@dataclass(slots=True, frozen=True)
class Curl:
    method: str
    path: str
    headers: dict[str, str]
    body: str | None

    def __str__(self) -> str:
        return f"{self.method} {self.path}"


def shell_blocks(page: str, heading: str) -> Iterator[str]:
    text = (DOCS / page).read_text()
    start = text.index(f"\n{heading}\n")
    end = text.find("\n## ", start + 1)
    section = text[start : end if end != -1 else len(text)]
    yield from re.findall(r"```sh\n(.*?)```", section, re.DOTALL)


def curls(block: str) -> Iterator[Curl]:
    """Each `curl` command of a shell block (comments, continuations and quoted newlines as the
    shell reads them)."""
    words = shlex.split(block.replace("\\\n", " "), comments=True)
    starts = [i for i, word in enumerate(words) if word == "curl"]
    for start, end in zip(starts, [*starts[1:], len(words)], strict=True):
        yield parsed(words[start + 1 : end])


def parsed(args: list[str]) -> Curl:
    method, url, headers, body = None, None, {}, None
    words = iter(args)
    for word in words:
        if word == "-X":
            method = next(words)
        elif word == "-H":
            name, _, value = next(words).partition(":")
            headers[name.strip()] = value.strip()
        elif word == "-d":
            body = next(words)
        elif not word.startswith("-"):
            url = word
    assert url is not None and url.startswith("localhost:8000/"), args
    path = url.removeprefix("localhost:8000")
    return Curl(method or ("POST" if body is not None else "GET"), path, headers, body)


def test_the_sections_hold_the_examples_they_should() -> None:
    examples = [str(c) for page, h in SECTIONS for b in shell_blocks(page, h) for c in curls(b)]
    assert "POST /v1/agents" in examples and "DELETE /v1/agents/alice" in examples
    assert "POST /v1/agents/planner/generate" in examples


# The pages whose Python examples name agents (`metadata.user_id`, `session_id`).
SDK_PAGES = ["getting-started.md", "first-agent.md", "clients.md"]
NAMED_AGENT = re.compile(r'"(?:user_id|session_id)":\s*"([^"]+)"')


def test_the_sdk_examples_name_no_agent_a_curl_example_creates() -> None:
    """The SDK examples run against the same server as the curl ones (they are not run here):
    an agent one of them names would make a later create of that id a 409, as the Anthropic
    example's `alice` once did."""
    named = {
        name
        for page in SDK_PAGES
        for block in re.findall(r"```python\n(.*?)```", (DOCS / page).read_text(), re.DOTALL)
        for name in NAMED_AGENT.findall(block)
    }
    assert {"sdk-anthropic", "sdk-openai", "haiku-writer"} <= named
    created = {
        json.loads(curl.body)["agent_id"]
        for page, heading in SECTIONS
        for block in shell_blocks(page, heading)
        for curl in curls(block)
        if curl.method == "POST"
        and re.fullmatch(r"/v1/agents(/[^/]+/fork)?", curl.path)
        and curl.body is not None
        and "agent_id" in json.loads(curl.body)
    }
    assert {"alice", "alice-what-if"} <= created
    assert named.isdisjoint(created)


def test_the_curl_examples_run_in_order_without_colliding(
    chat_served: ServedModel, tmp_path: Path
) -> None:
    # A pool the examples' agents fit in, as a real one (a pin may hold at most half of it).
    with chat_app(chat_served, tmp_path, num_blocks=512) as client:
        for page, heading in SECTIONS:
            for block in shell_blocks(page, heading):
                for curl in curls(block):
                    run(client, curl, f"{page}, {heading}")


def run(client: TestClient, curl: Curl, where: str) -> None:
    response = client.request(curl.method, curl.path, headers=curl.headers, content=curl.body)
    if response.status_code >= 400:
        pytest.fail(f"{where}: {curl} answered {response.status_code}: {response.text[:300]}")
