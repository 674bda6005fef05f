"""Claude Code 2.x's first request, recorded from the real CLI (tests/fixtures: local paths
replaced, long descriptions trimmed), keeps answering 200 with every field it sends; the
session's agent comes from its header when nothing more specific names it; a prompt longer
than the context gets the wording the CLI compacts on."""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from semantic.models.served import ServedModel
from semantic.text.tokenizer import Tokenizer
from tests.unit.fakes import fake_served, running, with_chatml

RECORDED = json.loads(
    (Path(__file__).parent.parent / "fixtures" / "claude_code_2_1_first_request.json").read_text()
)
SESSION = RECORDED["headers"]["X-Claude-Code-Session-Id"]


@pytest.fixture
def roomy(tiny_tokenizer: Tokenizer, tmp_path: Path) -> Iterator[TestClient]:
    """A context that holds the whole request (its tools come as the default tool prompt)."""
    served: ServedModel = with_chatml(fake_served(tiny_tokenizer, context=131_072))
    with running(served, tmp_path, num_blocks=512, block_tokens=256) as (client, _, _):
        yield client


def agent_ids(client: TestClient) -> list[str]:
    return [agent["agent_id"] for agent in client.get("/admin/cache").json()["agents"]]


def test_the_recording_carries_every_field_claude_code_2_sends() -> None:
    body, headers = RECORDED["body"], RECORDED["headers"]
    assert body["thinking"] == {"type": "adaptive"}
    assert body["output_config"]["effort"] in ("low", "medium", "high", "xhigh", "max")
    assert body["context_management"]["edits"]
    assert body["max_tokens"] >= 32_000 and body["stream"] is True
    assert [m["role"] for m in body["messages"]] == ["user", "system"]
    assert json.loads(body["metadata"]["user_id"])["session_id"] == SESSION
    assert body["system"][0]["text"].startswith("x-anthropic-billing-header")
    assert "claude-cli/2." in headers["User-Agent"] and RECORDED["path"].endswith("?beta=true")


def test_the_recorded_first_request_answers_200_and_names_the_session(roomy: TestClient) -> None:
    body = copy.deepcopy(RECORDED["body"]) | {"max_tokens": 8}
    with roomy.stream("POST", RECORDED["path"], json=body, headers=RECORDED["headers"]) as response:
        assert response.status_code == 200
        raw = "".join(response.iter_text())
    names = [line[7:] for line in raw.splitlines() if line.startswith("event: ")]
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"]
    assert agent_ids(roomy) == [SESSION]
    streamed = roomy.post(
        RECORDED["path"], json=body | {"stream": False}, headers=RECORDED["headers"]
    )
    assert streamed.status_code == 200 and streamed.json()["type"] == "message"


def test_without_metadata_the_session_header_names_the_agent(roomy: TestClient) -> None:
    body: dict[str, Any] = copy.deepcopy(RECORDED["body"]) | {"max_tokens": 4, "stream": False}
    del body["metadata"]
    assert roomy.post("/v1/messages", json=body, headers=RECORDED["headers"]).status_code == 200
    assert agent_ids(roomy) == [SESSION]


def test_a_side_request_without_tools_stays_anonymous_despite_the_header(
    roomy: TestClient,
) -> None:
    body: dict[str, Any] = copy.deepcopy(RECORDED["body"]) | {"max_tokens": 4, "stream": False}
    del body["tools"], body["metadata"]
    assert roomy.post("/v1/messages", json=body, headers=RECORDED["headers"]).status_code == 200
    assert agent_ids(roomy) == []


def test_the_recorded_request_past_the_context_gets_prompt_is_too_long(
    chat_served: ServedModel, tmp_path: Path
) -> None:
    with running(chat_served, tmp_path) as (client, _, _):
        response = client.post(RECORDED["path"], json=RECORDED["body"], headers=RECORDED["headers"])
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["message"].startswith("prompt is too long: ")
    said = re.fullmatch(r"prompt is too long: (\d+) tokens > (\d+) maximum", error["message"])
    assert said is not None and int(said[1]) > int(said[2])
