"""Engines over the fake runner and a tiny tokenizer, shared by the unit tests."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from semantic.api.app import create_app
from semantic.backends.fake import FakeRunner
from semantic.cache.pages import block_manager
from semantic.core import Batch
from semantic.engine import scheduler
from semantic.engine.engine import Engine
from semantic.engine.runner import StepToken
from semantic.engine.wiring import build_parts
from semantic.models.config import ModelConfig
from semantic.models.served import ServedModel
from semantic.settings.options import engine_options
from semantic.settings.settings import Settings
from semantic.text.chat import CHATML_TEMPLATE, ChatTemplate
from semantic.text.tokenizer import Tokenizer

CONTEXT = 512


def fake_served(
    tokenizer: Tokenizer, name: str = "tiny", context: int = CONTEXT, weights: str = "fake"
) -> ServedModel:
    """A model for the fake runner; `weights` stands for its weights' fingerprint."""
    config = ModelConfig("llama", 400, 8, 16, 1, 1, 1, 8, context)
    template = ChatTemplate("", bos_token=None, eos_token=None)
    return ServedModel(name, config, tokenizer, template, context, weights)


def shared_prefix(first: list[int], second: list[int]) -> int:
    """How many leading tokens two prompts share: what the second reads from the first's
    cache."""
    return next(
        (i for i, (a, b) in enumerate(zip(first, second, strict=False)) if a != b),
        min(len(first), len(second)),
    )


def with_chatml(served: ServedModel) -> ServedModel:
    """`served` with a ChatML template (`fake_served`'s renders nothing), for API tests."""
    template = ChatTemplate(CHATML_TEMPLATE, bos_token=None, eos_token="<|im_end|>")
    return dataclasses.replace(served, chat_template=template)


@contextmanager
def running(
    served: ServedModel, cache_dir: Path, **overrides: object
) -> Iterator[tuple[TestClient, SettledEngine, FakeRunner]]:
    """The whole app, engine thread included, over a fake runner (`make_engine` overrides)."""
    engine, runner = make_engine(served, cache_dir, **overrides)
    with TestClient(create_app(engine, engine.settings)) as client:
        yield client, engine, runner


@contextmanager
def chat_app(served: ServedModel, cache_dir: Path, **overrides: object) -> Iterator[TestClient]:
    """`running` with a ChatML template on `served`, for tests that need only the client."""
    with running(with_chatml(served), cache_dir, **overrides) as (client, _, _):
        yield client


def make_engine(
    served: ServedModel, cache_dir: Path, **overrides: object
) -> tuple[SettledEngine, FakeRunner]:
    """An engine on a fake runner (32 blocks of 8 tokens unless overridden) caching under
    `cache_dir`; overrides go to the runner or the settings, by name."""
    runner_args: dict[str, object] = {
        "num_blocks": 32,
        "block_tokens": 8,
        "vocab_size": 400,
        "first_token_id": 3,
        "fail_on_token": None,
        "fail_row_on_token": None,
        "layer_windows": (),
        "ngram": None,
    }
    runner_args |= {k: overrides.pop(k) for k in list(overrides) if k in runner_args}
    runner = FakeRunner(**runner_args)  # type: ignore[arg-type]
    return engine_on(runner, served, cache_dir, **overrides), runner


class SettledEngine(Engine):
    """An engine that keeps the settings its options were cut from, for the app a test builds
    around it (`create_app(engine, engine.settings)`)."""

    def __init__(self, runner: FakeRunner, served: ServedModel, settings: Settings) -> None:
        options = engine_options(settings)
        super().__init__(runner, served, options, build_parts(runner, served, options))
        self.settings = settings


def engine_on(
    runner: FakeRunner, served: ServedModel, cache_dir: Path, **settings: Any
) -> SettledEngine:
    """An engine on `runner` caching under `cache_dir`, with `make_engine`'s settings (32-token
    chunks, no batch window unless `settings` say otherwise)."""
    config = Settings(
        **{"max_batch_tokens": 32, "batch_window_ms": 0, **settings}, cache_dir=cache_dir
    )
    return SettledEngine(runner, served, config)


class SteppedRunner(FakeRunner):
    """The fake runner, but a step runs only when the test allows it (`allow`), or freely once
    `release`d: a request stays in flight, unable to finish, as long as a test needs."""

    def __init__(self, **args: Any) -> None:
        super().__init__(**args)
        self._permits = threading.Semaphore(0)
        self._ran = threading.Semaphore(0)
        self._released = False

    def run(self, batch: Batch) -> list[StepToken]:
        if not self._released:
            self._permits.acquire()
        tokens = super().run(batch)
        self._ran.release()
        return tokens

    def allow(self, steps: int = 1) -> None:
        self._permits.release(steps)

    def wait_for_a_step(self) -> None:
        """Block until a step has run (each call waits for one more)."""
        self._ran.acquire()

    def release(self) -> None:
        self._released = True
        self._permits.release()


def asgi_scope(path: str, headers: dict[str, str], method: str = "POST") -> dict[str, Any]:
    """An HTTP request's ASGI scope as uvicorn makes it, arrived on 127.0.0.1:8000: for tests
    that play the server's side themselves (a client that stops reading, a body that never
    ends)."""
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.4"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [(name.encode(), value.encode()) for name, value in headers.items()],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8000),
    }


class ManualClock:
    """A clock that moves only when a test moves it (`now`), for code that decides by the time:
    call it, or pass it as a `time` module's stand-in (`monotonic`). Tests never sleep past a
    timeout nor bound how long something took: they move this clock and count what happened."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def monotonic(self) -> float:
        return self.now


def scheduler_clock(monkeypatch: pytest.MonkeyPatch) -> ManualClock:
    """A `ManualClock` for what the scheduler and admission judge by the time (the queue
    timeout, a preempted answer's wait, a one-off's patience), starting at the real clock's
    reading so requests dated by it compare sanely."""
    clock = ManualClock(time.monotonic())
    for module in (scheduler, block_manager):
        monkeypatch.setattr(module, "time", clock)
    return clock
