"""What can fail before the model loads fails before it loads: `semantic serve` exits 2 with
one sentence that says what to do, and never reaches the load."""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import os
import re
import socket
import tomllib
from collections.abc import Iterator
from importlib.machinery import ModuleSpec
from pathlib import Path

import httpx
import pytest
import structlog

from semantic import cli
from semantic.cache.disk.folder_lock import FolderLock
from semantic.cache.disk.tier import cache_root
from semantic.commands import loader, preflight
from semantic.errors import CacheFolderBusy
from semantic.settings.settings import Settings


@pytest.fixture(autouse=True)
def _no_load(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    def load(*args: object) -> None:
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(loader, "build_host", load)
    monkeypatch.chdir(tmp_path)
    for name in [n for n in os.environ if n.startswith("SEMANTIC_")]:
        monkeypatch.delenv(name)
    # a `serve` that got past its checks would send the logs to this test's stderr
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    structlog.reset_defaults()


def serve(capsys: pytest.CaptureFixture[str], tmp_path: Path, *argv: str) -> str:
    """stderr of a `semantic serve` that must exit 2."""
    status = cli.main(["serve", "--cache-dir", str(tmp_path / "cache"), *argv])
    assert status == 2
    return capsys.readouterr().err


def test_a_port_in_use_fails_before_the_load_and_says_what_to_do(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        error = serve(capsys, tmp_path, "--port", str(port))
    assert f"port {port} on 127.0.0.1 is already in use" in error
    assert "--port" in error and "Errno" not in error


def test_a_cache_folder_that_cannot_be_created_fails_before_the_load(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "cache").write_text("a file where the folder should be")
    error = serve(capsys, tmp_path, "--port", "0")
    assert f"cannot use {tmp_path / 'cache' / 'kv'} as the cache folder (Not a directory)" in error
    assert "--cache-dir" in error and "Traceback" not in error


def test_a_cache_folder_others_may_write_fails_before_the_load_and_says_how_to_fix_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kv = tmp_path / "cache" / "kv"
    kv.mkdir(parents=True)
    (kv / "server.lock").touch()  # an earlier server's: the folder is not empty
    kv.chmod(0o777)
    error = serve(capsys, tmp_path, "--port", "0")
    assert f"refusing the cache folder {kv}: its group and others may write it" in error
    assert f"`chmod 700 {kv}`" in error and "Traceback" not in error


def test_a_missing_model_fails_before_the_load(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    error = serve(capsys, tmp_path, "--port", "0", "--model", str(tmp_path / "absent.gguf"))
    assert "unknown model" in error and "no such path" in error


def test_bad_settings_fail_before_the_load(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SEMANTIC_CACHE_BUDGET_MB", "abc")
    error = serve(capsys, tmp_path)
    assert "SEMANTIC_CACHE_BUDGET_MB=abc (environment variable)" in error


def test_without_torch_the_message_names_the_torch_extra(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    find_spec = importlib.util.find_spec

    def no_torch(name: str, package: str | None = None) -> ModuleSpec | None:
        return None if name == "torch" else find_spec(name, package)

    monkeypatch.setattr(importlib.util, "find_spec", no_torch)
    error = serve(capsys, tmp_path, "--port", "0")
    assert "torch is not installed (semantic's torch extra): pip install torch ninja" in error


def test_the_backend_installs_name_what_each_extra_holds_never_semantic_itself() -> None:
    """semantic is not on PyPI: `pip install 'semantic[torch]'` would fetch another package."""
    pyproject = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    extras = pyproject["project"]["optional-dependencies"]
    for backend, install in preflight._BACKEND_INSTALLS.items():
        for requirement in extras[backend]:
            name = re.split(r"[<>=~!\[;]", requirement)[0]
            assert f"pip install {name}" in install or f" {name} " in install, backend
        assert "semantic" not in install


def test_without_mlx_the_message_names_the_mlx_install(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    find_spec = importlib.util.find_spec

    def no_mlx(name: str, package: str | None = None) -> ModuleSpec | None:
        return None if name == "mlx" else find_spec(name, package)

    monkeypatch.setattr(importlib.util, "find_spec", no_mlx)
    error = serve(capsys, tmp_path, "--port", "0", "--backend", "mlx")
    assert "mlx is not installed" in error and "pip install 'mlx[cpu]'" in error


def test_the_checks_hold_the_folder_and_the_port_until_the_server_is_done(
    tmp_path: Path,
) -> None:
    settings = Settings(port=0, cache_dir=tmp_path)
    with preflight.checked(settings) as checked:
        url = checked.url
        assert url.startswith("http://127.0.0.1:") and not url.endswith(":0")
        with pytest.raises(CacheFolderBusy):
            FolderLock.acquire(cache_root(tmp_path))
        port = int(url.rsplit(":", 1)[1])
        socket.create_connection(("127.0.0.1", port), timeout=5).close()  # it listens
    FolderLock.acquire(cache_root(tmp_path)).release()
    with pytest.raises(httpx.ConnectError):
        httpx.get(url)


def test_the_servers_connections_send_at_once_without_waiting_for_acks(tmp_path: Path) -> None:
    """asyncio turns Nagle's algorithm off only on connections accepted from a TCP socket; with
    it on, a response's body waited for the client's delayed ACK of its head (40 ms)."""

    async def accepted_nodelay(listener: socket.socket) -> int:
        accepted: asyncio.Future[int] = asyncio.get_running_loop().create_future()

        def connected(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            sock = writer.get_extra_info("socket")
            accepted.set_result(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            writer.close()

        server = await asyncio.start_server(connected, sock=listener)
        async with server:
            _, writer = await asyncio.open_connection(*listener.getsockname()[:2])
            nodelay = await asyncio.wait_for(accepted, 10)
            writer.close()
        return nodelay

    with preflight.listening(Settings(port=0, cache_dir=tmp_path)) as listener:
        assert asyncio.run(accepted_nodelay(listener)) != 0
