"""Structured logs: JSON lines off a terminal, readable lines on one, every line of a request with
its request id and agent id (from the API's side and from the engine thread), and no API key in
any of them."""

from __future__ import annotations

import io
import json
import logging
import re
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TextIO

import pytest
import structlog
from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse
from fastapi.testclient import TestClient
from starlette.types import ASGIApp, Receive, Scope, Send

from semantic import core
from semantic.api.agents import named_agent
from semantic.api.app import create_app
from semantic.models.served import ServedModel
from semantic.observability import PrefillProgress, configure_logging
from tests.unit.fakes import make_engine

KEY, WRONG = "sk-log-test-0123456789", "sk-not-a-key-9876543210"
MESSAGE = {"model": "m", "max_tokens": 3, "messages": [{"role": "user", "content": "Hello"}]}
ANSI = re.compile(r"\x1b\[[0-9;]*m")


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture(autouse=True)
def restore_logging() -> Iterator[None]:
    """`configure_logging` changes the root logger and structlog: put both back."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    structlog.reset_defaults()
    logging.captureWarnings(False)


def lines(stream: io.StringIO) -> list[dict[str, Any]]:
    """Every line written, each parsed as JSON (so each must be)."""
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def with_probe(app: FastAPI) -> FastAPI:
    """A route that names an agent the way the APIs do, then logs from its body and from its
    stream (which runs after the route has returned, as every SSE answer does); and, outside
    every middleware, a line logged once the response is sent, as uvicorn's access line is."""
    probe_log = logging.getLogger("semantic.probe")

    def access_line(inner: ASGIApp) -> ASGIApp:
        async def logged(scope: Scope, receive: Receive, send: Send) -> None:
            await inner(scope, receive, send)
            if scope["type"] == "http":
                probe_log.info("after the response")

        return logged

    app.add_middleware(access_line)

    @app.get("/probe")
    async def probe(request: Request) -> StreamingResponse:
        named_agent(request.headers)
        probe_log.info("in the route")

        async def body() -> AsyncIterator[str]:
            probe_log.info("in the stream")
            yield "ok"

        return StreamingResponse(body())

    return app


@contextmanager
def logging_app(
    served: ServedModel, cache_dir: Path, stream: TextIO, level: str = "info", **settings: object
) -> Iterator[TestClient]:
    """The app, with the probe route, logging at `level` to `stream`."""
    configure_logging(level, stream)
    engine, _ = make_engine(served, cache_dir, **settings)
    with TestClient(with_probe(create_app(engine, engine.settings))) as client:
        yield client


def test_json_lines_carry_the_request_id_and_agent_id(
    chat_served: ServedModel, tmp_path: Path
) -> None:
    stream = io.StringIO()
    with logging_app(chat_served, tmp_path, stream) as client:
        probed = client.get("/probe", headers={"x-session-id": "probe-agent"})
        messages = client.post("/v1/messages", json=MESSAGE, headers={"x-session-id": "ann"})
        chat = {**MESSAGE, "session_id": "bob", "stream": True}
        chatted = client.post("/v1/chat/completions", json=chat)
    logged = lines(stream)

    probe_lines = [line for line in logged if line["logger"] == "semantic.probe"]
    probed_id = probed.headers["x-request-id"]
    events = [line["event"] for line in probe_lines if line["request_id"] == probed_id]
    assert events == ["in the route", "in the stream", "after the response"]
    for line in probe_lines:
        assert line["level"] == "info" and line["timestamp"].endswith("Z")
    agent_of = {line["request_id"]: line["agent_id"] for line in probe_lines}
    finished = {line["request_id"]: line for line in logged if line["event"] == "request finished"}
    for response, agent in ((probed, "probe-agent"), (messages, "ann"), (chatted, "bob")):
        assert agent_of[response.headers["x-request-id"]] == agent
    for response, agent in ((messages, "ann"), (chatted, "bob")):
        line = finished[response.headers["x-request-id"]]
        assert line["agent_id"] == agent
        assert line["finish_reason"] == "length" and line["output_tokens"] == 3
        # Where its time went, which benchmarks/agent_tasks.py splits a turn's time by.
        assert line["first_token_s"] is not None and 0 <= line["first_token_s"] <= line["seconds"]
    assert probed_id not in finished


def test_a_request_that_names_no_agent_logs_no_agent_id(
    chat_served: ServedModel, tmp_path: Path
) -> None:
    stream = io.StringIO()
    with logging_app(chat_served, tmp_path, stream) as client:
        client.get("/probe", headers={"x-session-id": "first"})
        anonymous = client.get("/probe")
    mine = [
        line
        for line in lines(stream)
        if line.get("request_id") == anonymous.headers["x-request-id"]
    ]
    assert mine and all("agent_id" not in line for line in mine)  # nothing left from `first`


def test_other_libraries_records_become_json_lines_at_the_level_asked(tmp_path: Path) -> None:
    stream = io.StringIO()
    configure_logging("warning", stream)
    # a library's logger, as uvicorn logs (uvicorn's own may be configured by an earlier test)
    library = logging.getLogger("some.library")
    library.info("dropped: below the level")
    library.warning("port %d busy", 8000, extra={"color_message": "port \x1b[1m%d\x1b[0m"})
    try:
        raise ValueError("bad")
    except ValueError:
        logging.getLogger("semantic.x").exception("it failed")
    [warning, error] = lines(stream)
    assert warning == {
        "event": "port 8000 busy",
        "logger": "some.library",
        "level": "warning",
        "timestamp": warning["timestamp"],
    }
    assert error["level"] == "error" and "ValueError: bad" in error["exception"]


def test_configuring_again_replaces_the_handler(tmp_path: Path) -> None:
    first, second = io.StringIO(), io.StringIO()
    configure_logging("info", first)
    configure_logging("info", second)
    logging.getLogger("semantic.x").info("once")
    assert first.getvalue() == "" and len(lines(second)) == 1


def test_a_terminal_gets_readable_lines_not_json(chat_served: ServedModel, tmp_path: Path) -> None:
    terminal = Terminal()
    with logging_app(chat_served, tmp_path, terminal) as client:
        response = client.post("/v1/messages", json=MESSAGE, headers={"x-session-id": "ann"})
    text = ANSI.sub("", terminal.getvalue())
    [line] = [line for line in text.splitlines() if "request finished" in line]
    assert not line.startswith("{")
    assert f"request_id={response.headers['x-request-id']}" in line
    assert "agent_id=ann" in line and "[info" in line
    assert "\x1b[" in terminal.getvalue()  # coloured, for a terminal


def test_api_keys_never_reach_the_json_logs(chat_served: ServedModel, tmp_path: Path) -> None:
    stream = io.StringIO()
    with logging_app(chat_served, tmp_path, stream, "debug", api_key=[KEY]) as client:
        for key in (KEY, WRONG):
            client.post("/v1/messages", json=MESSAGE, headers={"x-api-key": key})
            client.post(
                "/v1/chat/completions", json=MESSAGE, headers={"authorization": f"Bearer {key}"}
            )
            client.get("/metrics", headers={"x-api-key": key})
    output = stream.getvalue()
    refusals = [line for line in lines(stream) if line["event"].startswith("401 on")]
    assert len(refusals) == 3 and all(line["request_id"].startswith("req_") for line in refusals)
    assert KEY not in output and WRONG not in output


def test_a_long_prefill_logs_its_progress_and_its_rate(
    served: ServedModel, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Off a terminal too: a prompt of many tokens says how far it is while it is computed, in
    chunks of `max_batch_tokens`, and once done; a short one says nothing."""
    engine, _ = make_engine(served, tmp_path, num_blocks=64)  # chunks of 32 tokens
    ticks = iter(range(1000))
    engine.prefill_progress = PrefillProgress(
        min_tokens=200, every_s=2.0, clock=lambda: next(ticks)
    )
    caplog.set_level(logging.INFO, logger="semantic.engine")
    params = core.SamplingParams(temperature=0.0, max_tokens=3)
    long_prompt = core.Request("long", [3 + k % 390 for k in range(320)], params)
    short_prompt = core.Request("short", [3 + k % 300 for k in range(150)], params)
    for request in (long_prompt, short_prompt):
        engine.submit(request, lambda event: None)
    engine.run_until_idle()
    lines = [r for r in caplog.records if r.getMessage().startswith("prefill")]
    assert lines and all(getattr(r, "request_id", None) == "long" for r in lines)
    progress = [r.getMessage() for r in lines[:-1]]
    assert progress and all(
        re.match(r"prefill: \d+ of 320 tokens \(\d+%\) in", m) for m in progress
    )
    assert re.match(
        r"prefill done: 320 of 320 tokens \(100%\) in \d+\.\d s", lines[-1].getMessage()
    )
