"""A long cold prefill keeps every stream alive: a 10K-token prompt, prefilled in chunks by a
slowed fake runner, gets its protocol's heartbeat (Anthropic `ping` events, SSE comments with
the prefill's progress in the OpenAI APIs) before its first token. Claude Code ignores pings
(it gives up after 300 s without another event): a long silence gets an empty delta too."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from openai import OpenAI

from semantic.api import anthropic, responses
from semantic.api.app import create_app
from semantic.api.seal import Seals
from semantic.backends.fake import FakeRunner
from semantic.core import Batch
from semantic.engine.runner import StepToken
from semantic.engine.wiring import build_engine
from semantic.models.served import ServedModel
from semantic.server_key import ServerKey
from semantic.settings.options import engine_options
from semantic.settings.settings import Settings
from semantic.text.tokenizer import Tokenizer
from semantic.text.tools import CallEnd, CallStart, TextDelta
from tests.unit.fakes import fake_served, with_chatml

PROMPT_TOKENS = 10_000


class SlowPrefill(FakeRunner):
    """A step with prompt chunks in it takes a while, as a cold prefill does on a CPU."""

    def run(self, batch: Batch) -> list[StepToken]:
        if any(len(item.token_ids) > 1 for item in batch.items):
            time.sleep(0.04)
        return super().run(batch)


@pytest.fixture
def api(tiny_tokenizer: Tokenizer, tmp_path: Path) -> Iterator[TestClient]:
    served: ServedModel = with_chatml(fake_served(tiny_tokenizer, context=12_288))
    runner = SlowPrefill(num_blocks=50, block_tokens=256, vocab_size=400, first_token_id=3)
    settings = Settings(
        cache_dir=tmp_path, batch_window_ms=0, max_batch_tokens=512, keep_alive_s=0.05
    )
    engine = build_engine(runner, served, engine_options(settings))
    with TestClient(create_app(engine, settings)) as client:
        yield client


@pytest.fixture(scope="module")
def long_text(tiny_tokenizer: Tokenizer) -> str:
    sentence = "The quick brown fox jumps over the lazy dog. "
    text = sentence * (PROMPT_TOKENS // len(tiny_tokenizer.encode(sentence)))
    while len(tiny_tokenizer.encode(text)) < PROMPT_TOKENS:
        text += sentence * 20
    return text


def stream(api: TestClient, route: str, body: dict[str, Any]) -> list[str]:
    """The raw SSE frames, in order."""
    with api.stream("POST", route, json=body) as response:
        assert response.status_code == 200
        raw = "".join(response.iter_text())
    return [frame for frame in raw.split("\n\n") if frame]


def test_anthropic_pings_come_before_the_first_token(api: TestClient, long_text: str) -> None:
    body = {
        "model": "m",
        "max_tokens": 4,
        "stream": True,
        "messages": [{"role": "user", "content": long_text}],
    }
    frames = stream(api, "/v1/messages", body)
    first_block = next(i for i, f in enumerate(frames) if "content_block_start" in f)
    pings = [f for f in frames[1:first_block] if f.startswith("event: ping")]
    assert len(pings) >= 3  # one at once, then one per silent interval


def events(frames: list[str]) -> list[dict[str, Any]]:
    """The Anthropic events' payloads, in order."""
    return [json.loads(frame.split("data: ", 1)[1]) for frame in frames if "data: " in frame]


def test_anthropic_a_long_silence_gets_an_event_that_is_not_a_ping(
    api: TestClient, long_text: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(anthropic, "EMPTY_DELTA_AFTER_S", 0.1)  # the prefill takes ~0.8 s
    body = {
        "model": "m",
        "max_tokens": 4,
        "stream": True,
        "messages": [{"role": "user", "content": long_text}],
    }
    sent = events(stream(api, "/v1/messages", body))
    first_text = next(
        i for i, e in enumerate(sent) if e.get("delta", {}).get("text") and "index" in e
    )
    before = [e for e in sent[1:first_text] if e["type"] != "ping"]
    # Claude Code's watchdog counts these: a text block, opened early, with empty deltas.
    assert before[0] == {
        "type": "content_block_start",
        "index": 0,
        "content_block": {"type": "text", "text": ""},
    }
    empty = {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": ""}}
    assert len(before) >= 2 and all(e == empty for e in before[1:])
    # The answer goes on in that block: one text block in all.
    assert [e["index"] for e in sent if e["type"] == "content_block_start"] == [0]


def test_a_call_that_comes_first_stops_the_kept_alive_text_block(tmp_path: Path) -> None:
    blocks = anthropic._Blocks(Seals(ServerKey(tmp_path), None, 0))
    opened = blocks.keep_alive()
    assert [e["type"] for e in opened] == ["content_block_start", "content_block_delta"]
    call = blocks.payloads(CallStart(0, "Bash"))
    assert call[0] == {"type": "content_block_stop", "index": 0}
    assert call[1]["index"] == 1 and call[1]["content_block"]["type"] == "tool_use"
    # A keep-alive while the call streams adds nothing to its arguments.
    assert blocks.keep_alive() == [
        {
            "type": "content_block_delta",
            "index": 1,
            "delta": {"type": "input_json_delta", "partial_json": ""},
        }
    ]
    blocks.payloads(CallEnd(0))
    assert blocks.payloads(TextDelta("done"))[0]["index"] == 2


def test_openai_comments_report_the_prefill_before_the_first_token(
    api: TestClient, long_text: str
) -> None:
    body = {
        "model": "m",
        "max_tokens": 4,
        "stream": True,
        "messages": [{"role": "user", "content": long_text}],
    }
    frames = stream(api, "/v1/chat/completions", body)
    first_text = next(
        i for i, f in enumerate(frames) if '"content":"' in f and '"content":""' not in f
    )
    comments = [f for f in frames[:first_text] if f.startswith(":")]
    assert len(comments) >= 3
    progress = [
        tuple(map(int, m.groups()))
        for f in comments
        if (m := re.match(r": prefill (\d+)/(\d+)", f))
    ]
    assert progress and all(total >= PROMPT_TOKENS for _, total in progress)
    assert [done for done, _ in progress] == sorted(done for done, _ in progress)


def test_responses_comments_come_before_the_first_token(api: TestClient, long_text: str) -> None:
    body = {"model": "m", "max_output_tokens": 4, "stream": True, "input": long_text}
    frames = stream(api, "/v1/responses", body)
    first_item = next(i for i, f in enumerate(frames) if "response.output_item.added" in f)
    assert len([f for f in frames[:first_item] if f.startswith(":")]) >= 3


def test_responses_a_long_silence_gets_in_progress_events_codex_counts(
    api: TestClient, long_text: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(responses, "IN_PROGRESS_AFTER_S", 0.1)  # the prefill takes ~0.8 s
    body = {"model": "m", "max_output_tokens": 4, "stream": True, "input": long_text}
    sent = events(stream(api, "/v1/responses", body))
    kinds = [e["type"] for e in sent]
    first_item = kinds.index("response.output_item.added")
    assert kinds[:2] == ["response.created", "response.in_progress"]
    # Events, not comments: Codex's idle timer counts only those.
    assert kinds[2:first_item] == ["response.in_progress"] * (first_item - 2)
    assert first_item - 2 >= 2
    again = sent[2]["response"]
    assert again["status"] == "in_progress" and again["id"] == sent[0]["response"]["id"]
    assert [e["sequence_number"] for e in sent] == list(range(len(sent)))
    assert kinds[-1] == "response.incomplete"  # its 4 tokens ran out


def test_the_openai_sdk_reads_a_stream_with_in_progress_again(
    api: TestClient, long_text: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(responses, "IN_PROGRESS_AFTER_S", 0.1)
    client = OpenAI(base_url=f"{api.base_url}/v1", api_key="unused", http_client=api)
    with client.responses.stream(model="m", input=long_text, max_output_tokens=4) as stream:
        sent = list(stream)
    kinds = [event.type for event in sent]
    assert kinds.count("response.in_progress") >= 3
    assert "response.output_text.delta" in kinds and kinds[-1] == "response.incomplete"
