"""A client that stops reading its response is cut off after `send_timeout_s`: its request is
aborted through the engine's abort path (its blocks stay as cache), its lease and the
lifecycle's count end, and the app returns, so the server closes the connection. The client
here is the ASGI server's side of one: it takes the first parts of the response, then a send
never returns (a socket whose buffers are full), and it never disconnects."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from starlette.types import Message

from semantic.api import slow_clients
from semantic.api.app import create_app
from semantic.api.server import DrainingServer, uvicorn_config
from semantic.engine.engine import Engine
from semantic.text.tokenizer import Tokenizer
from tests.unit.fakes import asgi_scope, engine_on
from tests.unit.live_server import (
    LONG_CONTEXT,
    Aborts,
    fake_runner,
    long_chat_served,
    stop_signals_ignored,
)

TIMEOUT_S = 0.3
Connection = tuple[asyncio.StreamReader, asyncio.StreamWriter]
PROMPT = [3 + (k * 11) % 390 for k in range(20)]


class StuckClient:
    """An ASGI client that sends `body`, reads `reads` messages of the response, then blocks
    in `send` for ever."""

    def __init__(self, body: dict[str, Any], reads: int) -> None:
        self.body = json.dumps(body).encode()
        self.reads = reads
        self.sent: list[Message] = []
        self._asked = False
        self._never = asyncio.Event()

    async def receive(self) -> dict[str, Any]:
        if not self._asked:
            self._asked = True
            return {"type": "http.request", "body": self.body, "more_body": False}
        await self._never.wait()  # no disconnect: the connection stays open
        raise AssertionError("unreachable")

    async def send(self, message: Message) -> None:
        if len(self.sent) >= self.reads:
            await self._never.wait()
        self.sent.append(message)


async def served_to(app: FastAPI, path: str, client: StuckClient) -> None:
    """The app's answer to `client`, its lifespan around it; fails if it never returns."""
    async with app.router.lifespan_context(app):
        scope = asgi_scope(path, {"host": "127.0.0.1:8000", "content-type": "application/json"})
        await asyncio.wait_for(app(scope, client.receive, client.send), timeout=60)


def stuck_app(tiny_tokenizer: Tokenizer, tmp_path: Path) -> tuple[FastAPI, Engine]:
    engine = engine_on(
        fake_runner(), long_chat_served(tiny_tokenizer), tmp_path, send_timeout_s=TIMEOUT_S
    )
    return create_app(engine, engine.settings), engine


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/messages"])
def test_a_stream_the_client_stops_reading_is_aborted_and_its_cache_kept(
    tiny_tokenizer: Tokenizer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    app, engine = stuck_app(tiny_tokenizer, tmp_path)
    aborts = Aborts(engine, monkeypatch)
    body: dict[str, Any] = {"model": "m", "max_tokens": LONG_CONTEXT - 100, "stream": True}
    if path == "/v1/completions":
        body["prompt"] = PROMPT
    else:
        body["messages"] = [{"role": "user", "content": "Hello world!"}]
    client = StuckClient(body, reads=3)

    async def scenario() -> tuple[Any, int]:
        await served_to(app, path, client)
        stats = await asyncio.to_thread(engine.stats)
        return stats, app.state.lifecycle.in_flight

    stats, in_flight = asyncio.run(scenario())
    assert client.sent[0]["status"] == 200
    assert aborts.seen.is_set()  # the engine's abort path, as for a disconnect
    assert in_flight == 0  # the lease and the lifecycle's count ended with it
    assert stats.running == 0 and stats.blocks_held == 0 and stats.blocks_cached > 0


def test_a_whole_answer_the_client_does_not_take_ends_its_response(
    tiny_tokenizer: Tokenizer, tmp_path: Path
) -> None:
    app, _ = stuck_app(tiny_tokenizer, tmp_path)
    client = StuckClient({"model": "m", "prompt": PROMPT, "max_tokens": 5}, reads=1)
    asyncio.run(served_to(app, "/v1/completions", client))
    assert client.sent[0]["status"] == 200 and len(client.sent) == 1
    assert app.state.lifecycle.in_flight == 0


def test_past_max_connections_a_new_connection_gets_503(
    tiny_tokenizer: Tokenizer, tmp_path: Path
) -> None:
    """Each open connection holds a socket and, once it sends, a task: `max_connections` of
    them are served, the next is refused at once (uvicorn's `limit_concurrency`); a health
    check is answered all the same."""
    engine = engine_on(fake_runner(), long_chat_served(tiny_tokenizer), tmp_path, port=0)
    settings = engine.settings.model_copy(update={"max_connections": 2})
    app = create_app(engine, settings)

    async def scenario() -> list[int]:
        server = DrainingServer(uvicorn_config(app, settings), app.state.lifecycle, 1)
        serving = asyncio.create_task(server.serve())
        while not server.started:
            await asyncio.sleep(0.01)
        port = server.servers[0].sockets[0].getsockname()[1]
        url = f"http://127.0.0.1:{port}/v1/models"
        statuses = []
        async with httpx.AsyncClient() as client:
            statuses.append((await client.get(url)).status_code)  # its connection stays open
            idle = await asyncio.open_connection("127.0.0.1", port)
            statuses.append((await client.get(url)).status_code)  # its own, kept alive
            async with httpx.AsyncClient() as third:
                statuses.append((await third.get(url)).status_code)
                statuses.append(
                    (await third.get(f"http://127.0.0.1:{port}/health/live")).status_code
                )
            idle[1].close()
            await idle[1].wait_closed()
            while len(server.server_state.connections) > 1:  # the server sees them closed
                await asyncio.sleep(0.01)
            async with httpx.AsyncClient() as fourth:
                statuses.append((await fourth.get(url)).status_code)
        server.should_exit = True
        await asyncio.wait_for(serving, timeout=60)
        return statuses

    with stop_signals_ignored():
        assert asyncio.run(scenario()) == [200, 200, 503, 200, 200]


# Each stops before its request is whole: nothing at all, half a head (slowloris), half a body.
HALF_REQUESTS = [
    b"",
    b"GET /health/live HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ",
    b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    b"Content-Length: 100\r\n\r\n{",
]


def test_a_client_that_stops_sending_its_request_is_cut_off(
    tiny_tokenizer: Tokenizer, tmp_path: Path
) -> None:
    """uvicorn alone waits for ever for a request's head and body, so such connections held
    their place in `max_connections` for good (enough of them shut every client out): past
    `receive_timeout_s` each is closed, and whole requests are still served."""
    engine = engine_on(fake_runner(), long_chat_served(tiny_tokenizer), tmp_path, port=0)
    settings = engine.settings.model_copy(update={"receive_timeout_s": TIMEOUT_S})
    app = create_app(engine, settings)

    async def cut_off(port: int, sent: bytes) -> bytes:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(sent)
        try:  # before, the server never answered and never closed
            return await asyncio.wait_for(reader.read(), timeout=30)
        finally:
            writer.close()

    async def scenario() -> tuple[list[bytes], int]:
        server = DrainingServer(uvicorn_config(app, settings), app.state.lifecycle, 1)
        serving = asyncio.create_task(server.serve())
        while not server.started:
            await asyncio.sleep(0.01)
        port = server.servers[0].sockets[0].getsockname()[1]
        answers = await asyncio.gather(*(cut_off(port, sent) for sent in HALF_REQUESTS))
        async with httpx.AsyncClient() as client:
            body = {"model": "m", "prompt": PROMPT, "max_tokens": 2}
            whole = await client.post(f"http://127.0.0.1:{port}/v1/completions", json=body)
        server.should_exit = True
        await asyncio.wait_for(serving, timeout=60)
        return answers, whole.status_code

    with stop_signals_ignored():
        answers, status = asyncio.run(scenario())
    assert answers == [b"", b"", b""]  # closed, with nothing written
    assert status == 200


def test_idle_connections_past_the_limit_leave_liveness_answered_and_are_soon_closed(
    tiny_tokenizer: Tokenizer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sockets that each sent one byte held every place for `receive_timeout_s` (60 s), and a
    liveness probe got 503 meanwhile (520 of them against the default 512, from anyone once
    the server is remote): a probe is answered past the limit, and a connection that sends no
    whole head is closed after the head's timeout (10 s; 1 s here), not `receive_timeout_s`,
    which frees the places for requests. The places are checked while the head's timeout is
    an hour, so no slow moment of the machine can close the sockets before the check; then
    new sockets get 1 s, and the test waits (a hang guard of 30 s) for the server to close
    them."""
    monkeypatch.setattr(slow_clients, "HEAD_TIMEOUT_S", 3600.0)
    engine = engine_on(fake_runner(), long_chat_served(tiny_tokenizer), tmp_path, port=0)
    settings = engine.settings.model_copy(update={"max_connections": 4})
    app = create_app(engine, settings)

    async def idle(server: DrainingServer, port: int) -> list[Connection]:
        before = len(server.server_state.connections)
        sockets = [await asyncio.open_connection("127.0.0.1", port) for _ in range(6)]
        for _, writer in sockets:
            writer.write(b"G")
        while len(server.server_state.connections) < before + 6:  # the server has them all
            await asyncio.sleep(0.01)
        return sockets

    async def scenario() -> tuple[list[int], list[bytes]]:
        server = DrainingServer(uvicorn_config(app, settings), app.state.lifecycle, 1)
        serving = asyncio.create_task(server.serve())
        while not server.started:
            await asyncio.sleep(0.01)
        port = server.servers[0].sockets[0].getsockname()[1]
        base = f"http://127.0.0.1:{port}"
        held = await idle(server, port)
        statuses = []
        async with httpx.AsyncClient() as client:
            statuses.append((await client.get(f"{base}/health/live")).status_code)
            statuses.append((await client.get(f"{base}/v1/models")).status_code)
        for _, writer in held:
            writer.close()
        protocol = server.config.http_protocol_class
        monkeypatch.setattr(protocol, "head_timeout_s", 1.0)
        while server.server_state.connections:  # the server saw them all close
            await asyncio.sleep(0.01)
        quiet = await idle(server, port)
        closed = [await asyncio.wait_for(reader.read(), timeout=30) for reader, _ in quiet]
        async with httpx.AsyncClient() as client:
            statuses.append((await client.get(f"{base}/v1/models")).status_code)
        for _, writer in quiet:
            writer.close()
        server.should_exit = True
        await asyncio.wait_for(serving, timeout=60)
        return statuses, closed

    with stop_signals_ignored():
        statuses, closed = asyncio.run(scenario())
    assert statuses == [200, 503, 200]
    assert closed == [b""] * 6  # closed by the server, with nothing written
