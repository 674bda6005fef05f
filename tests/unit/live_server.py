"""A real uvicorn server in the test's process, as `semantic serve` runs it (`api/server.py`),
over the fake runner: for what only a real server shows (signals, disconnects, the port open
while draining)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import signal
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi import FastAPI

from semantic.api.lifecycle import RESPONSE_GRACE_S
from semantic.api.server import DrainingServer
from semantic.backends.fake import FakeRunner
from semantic.engine.engine import Engine
from semantic.models.served import ServedModel
from semantic.text.chat import CHATML_TEMPLATE, ChatTemplate
from semantic.text.tokenizer import Tokenizer
from tests.unit.fakes import fake_served

LONG_CONTEXT = 1 << 16  # an answer with this many tokens outlasts any test


class Submissions:
    """Counts the requests the routes hand the engine; `reached(n)` waits for the n-th."""

    def __init__(self, engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        self._more: asyncio.Event | None = None
        submit = engine.submit

        def spy(*args: Any, **kwargs: Any) -> None:
            submit(*args, **kwargs)
            self.count += 1
            if self._more is not None:
                self._more.set()

        monkeypatch.setattr(engine, "submit", spy)

    async def reached(self, count: int) -> None:
        while self.count < count:
            self._more = asyncio.Event()
            await self._more.wait()


class Aborts:
    """Waits for the API to abort a request (what a disconnect must cause)."""

    def __init__(self, engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
        self.seen = asyncio.Event()
        abort = engine.abort

        def spy(request_id: str) -> None:
            abort(request_id)
            self.seen.set()

        monkeypatch.setattr(engine, "abort", spy)


def long_chat_served(tokenizer: Tokenizer) -> ServedModel:
    """A fake model with a chat template and a context no test answer reaches the end of."""
    template = ChatTemplate(CHATML_TEMPLATE, bos_token=None, eos_token="<|im_end|>")
    served = fake_served(tokenizer, context=LONG_CONTEXT)
    return dataclasses.replace(served, chat_template=template)


def fake_runner(runner_class: type[FakeRunner] = FakeRunner) -> FakeRunner:
    """A runner with room in its pool for such answers."""
    return runner_class(num_blocks=9000, block_tokens=8, vocab_size=400, first_token_id=3)


class Observed(DrainingServer):
    """The server `semantic serve` runs, telling the test when it is up and when it drains."""

    def __init__(self, app: FastAPI, timeout_s: float) -> None:
        config = uvicorn.Config(
            app,
            host="127.0.0.1",
            port=0,
            log_config=None,
            timeout_graceful_shutdown=RESPONSE_GRACE_S,
        )
        super().__init__(config, app.state.lifecycle, timeout_s)
        self.up, self.draining = asyncio.Event(), asyncio.Event()

    async def startup(self, sockets: Any = None) -> None:
        await super().startup(sockets)
        self.up.set()

    async def on_tick(self, counter: int) -> bool:
        if self.should_exit:
            self.draining.set()  # seen by the test once the drain awaits (its phase is set)
        return await super().on_tick(counter)

    @property
    def url(self) -> str:
        port = self.servers[0].sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"


@contextlib.contextmanager
def stop_signals_ignored() -> Iterator[None]:
    """uvicorn re-raises the stop signal it caught once it has shut down; like `semantic
    serve` (api/server.py), the test process lets it pass."""
    before = {s: signal.signal(s, lambda signum, frame: None) for s in (signal.SIGTERM,)}
    try:
        yield
    finally:
        for stop_signal, handler in before.items():
            signal.signal(stop_signal, handler)


@contextlib.asynccontextmanager
async def serving(app: FastAPI, timeout_s: float) -> AsyncIterator[Observed]:
    """`app` served on a free port until the block ends; it then stops as after a signal,
    unless a signal already stopped it (its drain has `timeout_s`)."""
    server = Observed(app, timeout_s)
    task = asyncio.create_task(server.serve())
    await server.up.wait()
    try:
        yield server
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, timeout=60)


async def sigterm(server: Observed) -> None:
    os.kill(os.getpid(), signal.SIGTERM)
    await server.draining.wait()


async def payloads(response: httpx.Response) -> AsyncIterator[Any]:
    """The SSE data of a response: parsed JSON, or the string `[DONE]`."""
    async for line in response.aiter_lines():
        if line.startswith("data: "):
            data = line.removeprefix("data: ")
            yield data if data == "[DONE]" else json.loads(data)
