"""The whole app over the fake runner, served over real HTTP by uvicorn on a thread of the test
process: for tests that drive a server from outside (schemathesis, the soak script) but need no
real model, so that generation is instant and any `max_tokens` is cheap."""

from __future__ import annotations

import dataclasses
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import uvicorn

from semantic.api.app import create_app
from semantic.engine.engine import Engine
from semantic.text.chat import CHATML_TEMPLATE, ChatTemplate
from semantic.text.tokenizer import Tokenizer
from tests.unit.fakes import fake_served, make_engine


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def fake_server(
    tokenizer: Tokenizer, cache_dir: Path, context: int = 512, **settings: object
) -> Iterator[str]:
    """The base URL of the app on the fake runner (a ChatML template, a `context`-token context,
    128 blocks of 8 tokens unless `settings` say otherwise), until the block ends."""
    with fake_engine_server(tokenizer, cache_dir, context, **settings) as (url, _):
        yield url


@contextmanager
def fake_engine_server(
    tokenizer: Tokenizer, cache_dir: Path, context: int = 512, **settings: object
) -> Iterator[tuple[str, Engine]]:
    """`fake_server`, and its engine (for checks of its pool once it is idle)."""
    template = ChatTemplate(CHATML_TEMPLATE, bos_token=None, eos_token="<|im_end|>")
    served = dataclasses.replace(fake_served(tokenizer, context=context), chat_template=template)
    engine, _ = make_engine(served, cache_dir, **({"num_blocks": 128} | settings))
    port = _free_port()
    app = create_app(engine, engine.settings)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:  # uvicorn offers no event to wait on
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}", engine
    finally:
        server.should_exit = True
        thread.join(timeout=30)
