"""Graceful shutdown and the health checks, over the fake runner. The shutdown tests run the
real uvicorn server of `semantic serve` (`api/server.py`) in this process and send this process
a real SIGTERM: new requests get a 503 in their protocol's shape while running ones finish, or
past `shutdown_timeout_s` end with an error event; then every hot cache is persisted."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from semantic.api.app import create_app
from semantic.api.lifecycle import Lifecycle, Phase
from semantic.core import Request, SamplingParams, TokenEvent
from semantic.errors import Unavailable
from semantic.models.served import ServedModel
from semantic.text.tokenizer import Tokenizer
from tests.unit.fakes import SteppedRunner, engine_on
from tests.unit.live_server import (
    LONG_CONTEXT,
    Submissions,
    fake_runner,
    long_chat_served,
    payloads,
    serving,
    sigterm,
    stop_signals_ignored,
)

PROMPT = [3 + (k * 11) % 390 for k in range(20)]
ENDLESS = {"model": "m", "prompt": PROMPT, "max_tokens": LONG_CONTEXT - 100}
USER = [{"role": "user", "content": "Hello world!"}]


@pytest.fixture
def chat_served(tiny_tokenizer: Tokenizer) -> ServedModel:
    return long_chat_served(tiny_tokenizer)


async def refused_while_draining(client: httpx.AsyncClient) -> None:
    """Every check a draining server must pass, asked over new connections."""
    ready = await client.get("/health/ready")
    assert ready.status_code == 503 and ready.json()["reason"] == "draining"
    assert (await client.get("/health/live")).status_code == 200
    assert (await client.get("/health/startup")).status_code == 200
    chat = await client.post("/v1/chat/completions", json={"model": "m", "messages": USER})
    assert chat.status_code == 503 and chat.json()["error"]["code"] == "unavailable"
    body = {"model": "claude-x", "max_tokens": 5, "messages": USER}
    message = await client.post("/v1/messages", json=body)
    assert message.status_code == 503 and message.json()["type"] == "error"
    assert "shutting down" in message.json()["error"]["message"]


def next_turn_from_disk(served: ServedModel, cache_dir: Path) -> int:
    """A restarted engine's answer to alice's next turn: how many prompt tokens came cached
    from disk."""
    engine = engine_on(fake_runner(), served, cache_dir)
    request = Request("next", [*PROMPT, 5, 6], SamplingParams(max_tokens=1), agent_id="alice")
    events: list[TokenEvent] = []
    engine.submit(request, events.append)
    engine.run_until_idle()
    assert events[-1].usage is not None
    assert engine.agents.stats.counters.hit_tokens_disk == events[-1].usage.cached_tokens
    return events[-1].usage.cached_tokens


def test_a_stop_signal_lets_running_requests_finish_refuses_new_ones_and_persists(
    chat_served: ServedModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runner = fake_runner(SteppedRunner)
    assert isinstance(runner, SteppedRunner)
    engine = engine_on(runner, chat_served, tmp_path)
    submissions = Submissions(engine, monkeypatch)
    app = create_app(engine, engine.settings)
    body = {**ENDLESS, "max_tokens": 8, "stream": True, "session_id": "alice"}

    async def scenario() -> list[Any]:
        async with (
            serving(app, timeout_s=60) as server,
            httpx.AsyncClient(base_url=server.url, timeout=30) as client,
            client.stream("POST", "/v1/completions", json=body) as running,
        ):
            await submissions.reached(1)  # it runs, and cannot finish: its first step waits
            await sigterm(server)
            await refused_while_draining(client)
            runner.release()
            return [event async for event in payloads(running)]

    with stop_signals_ignored():
        events = asyncio.run(scenario())
    assert events[-1] == "[DONE]" and events[-2]["choices"][0]["finish_reason"] == "length"
    lifecycle: Lifecycle = app.state.lifecycle
    assert lifecycle.phase is Phase.STOPPED and not engine.alive
    assert next_turn_from_disk(chat_served, tmp_path) >= 16  # its blocks, read from disk


def test_past_the_shutdown_timeout_running_requests_end_with_their_protocols_error(
    chat_served: ServedModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = engine_on(fake_runner(), chat_served, tmp_path)
    submissions = Submissions(engine, monkeypatch)
    app = create_app(engine, engine.settings)
    anthropic = {"model": "claude-x", "max_tokens": LONG_CONTEXT - 100, "messages": USER}

    async def answer(client: httpx.AsyncClient) -> httpx.Response:
        return await client.post("/v1/completions", json={**ENDLESS, "session_id": "alice"})

    async def scenario() -> tuple[list[Any], list[str], httpx.Response]:
        async with (
            serving(app, timeout_s=0) as server,
            httpx.AsyncClient(base_url=server.url, timeout=30) as client,
            client.stream("POST", "/v1/completions", json={**ENDLESS, "stream": True}) as openai,
            client.stream("POST", "/v1/messages", json={**anthropic, "stream": True}) as claude,
        ):
            whole = asyncio.create_task(answer(client))
            await submissions.reached(3)
            await sigterm(server)
            openai_rest = [event async for event in payloads(openai)]
            claude_rest = [line async for line in claude.aiter_lines()]
            return openai_rest, claude_rest, await whole

    with stop_signals_ignored():
        openai_rest, claude_rest, whole = asyncio.run(scenario())
    assert openai_rest[-1]["error"]["code"] == "unavailable" and "[DONE]" not in openai_rest
    error = json.loads(claude_rest[claude_rest.index("event: error") + 1].removeprefix("data: "))
    assert error["error"]["message"] == "the server shut down before this request finished"
    assert "event: message_stop" not in claude_rest
    assert whole.status_code == 503 and whole.json()["error"]["code"] == "unavailable"
    assert app.state.lifecycle.phase is Phase.STOPPED
    assert next_turn_from_disk(chat_served, tmp_path) >= 16


def test_a_second_signal_cancels_what_still_runs_at_once(
    chat_served: ServedModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = engine_on(fake_runner(), chat_served, tmp_path)
    submissions = Submissions(engine, monkeypatch)
    app = create_app(engine, engine.settings)

    async def scenario() -> list[Any]:
        async with (
            serving(app, timeout_s=600) as server,
            httpx.AsyncClient(base_url=server.url, timeout=30) as client,
            client.stream("POST", "/v1/completions", json={**ENDLESS, "stream": True}) as running,
        ):
            await submissions.reached(1)
            await sigterm(server)
            os.kill(os.getpid(), signal.SIGTERM)  # don't wait the 600 s
            return [event async for event in payloads(running)]

    with stop_signals_ignored():
        rest = asyncio.run(scenario())
    assert rest[-1]["error"]["code"] == "unavailable"
    assert app.state.lifecycle.phase is Phase.STOPPED


def test_a_request_cancelled_at_shutdown_keeps_its_partial_last_block_through_a_restart(
    chat_served: ServedModel, tmp_path: Path
) -> None:
    """Cancelling is not failing: what the request computed, its partial last block included,
    is cached, persisted, and reused after a restart."""
    runner = fake_runner(SteppedRunner)
    assert isinstance(runner, SteppedRunner)
    engine = engine_on(runner, chat_served, tmp_path)
    # 20 tokens and 2 or 3 computed answer tokens: two full 8-token blocks and a partial one
    cut = Request("cut", PROMPT, SamplingParams(max_tokens=100), agent_id="alice")

    async def scenario() -> TokenEvent:
        events = engine.stream(cut)
        runner.allow(3)  # the prompt and two more tokens are computed
        await anext(events)  # (the stream submits the request once it is read)
        for _ in range(3):
            await asyncio.to_thread(runner.wait_for_a_step)
        error = Unavailable("the server shut down before this request finished")
        cancelling = asyncio.ensure_future(engine.cancel_all(error))
        await asyncio.sleep(0)  # the task posts its message to the engine
        runner.allow(1)  # at most one more token is computed before the cancel is taken
        await cancelling
        return [event async for event in events][-1]

    engine.start()
    try:
        final = asyncio.run(scenario())
    finally:
        engine.stop()  # persists
    assert isinstance(final.error, Unavailable)
    restarted = engine_on(fake_runner(), chat_served, tmp_path)
    # It diverges from the cut answer inside the partial block: that block is reused up to there.
    returning = Request("back", [*PROMPT, 8, 9], SamplingParams(max_tokens=1), agent_id="alice")
    events: list[TokenEvent] = []
    restarted.submit(returning, events.append)
    restarted.run_until_idle()
    assert events[-1].usage is not None and events[-1].usage.cached_tokens == len(PROMPT)


# -- the health checks ------------------------------------------------------------------------


def test_before_the_engine_starts_it_is_live_but_neither_started_nor_ready(
    chat_served: ServedModel, tmp_path: Path
) -> None:
    engine = engine_on(fake_runner(), chat_served, tmp_path)
    client = TestClient(create_app(engine, engine.settings))  # its lifespan has not run
    assert client.get("/health/live").status_code == 200
    startup = client.get("/health/startup")
    assert startup.status_code == 503 and startup.json()["status"] == "starting"
    ready = client.get("/health/ready")
    assert ready.status_code == 503 and ready.json()["reason"] == "starting"


def test_ready_serving_reports_the_pool_and_a_dead_engine_thread_makes_it_503(
    chat_served: ServedModel, tmp_path: Path
) -> None:
    engine = engine_on(fake_runner(), chat_served, tmp_path)
    with TestClient(create_app(engine, engine.settings)) as client:
        started = client.get("/health/startup")
        assert started.status_code == 200 and started.json()["status"] == "started"
        ready = client.get("/health/ready")
        assert ready.status_code == 200 and ready.json()["status"] == "ready"
        assert ready.json()["blocks_total"] == 9000 and ready.json()["model"] == "tiny"
        engine.stop()  # as if the engine thread had died
        dead = client.get("/health/ready")
        assert dead.status_code == 503
        assert dead.json()["reason"] == "the engine thread is not running"
        assert client.get("/health/live").status_code == 200
        assert client.get("/health/startup").status_code == 200
