"""One cache folder, one server: the folder's lock refuses a second holder, naming the folder and
the first holder's pid; a second `semantic serve` fails before it loads a model, and `semantic
agents delete` does not touch a folder a server holds."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from semantic import cli
from semantic.cache.agents.manifest import AgentManifest, load_manifest, save_manifest
from semantic.cache.disk.folder_lock import FolderLock
from semantic.cache.disk.tier import cache_root
from semantic.commands import loader
from semantic.core import AgentKey
from semantic.errors import CacheFolderBusy

HOLD = (
    "import sys; from pathlib import Path; from semantic.cache.disk.folder_lock import FolderLock; "
    "lock = FolderLock.acquire(Path(sys.argv[1])); print('held', flush=True); sys.stdin.read()"
)


def hold_in_another_process(folder: Path) -> subprocess.Popen[str]:
    """A process that takes the folder's lock and keeps it until its stdin closes."""
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(folder)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None and holder.stdout.readline() == "held\n"
    return holder


def test_a_second_holder_is_refused_with_the_folder_and_the_holders_pid(tmp_path: Path) -> None:
    holder = hold_in_another_process(tmp_path / "kv")
    try:
        with pytest.raises(CacheFolderBusy) as busy:
            FolderLock.acquire(tmp_path / "kv")
        assert busy.value.holder_pid == holder.pid
        assert str(tmp_path / "kv") in str(busy.value) and f"pid {holder.pid}" in str(busy.value)
    finally:
        holder.communicate("")  # it exits, and the lock with it
    FolderLock.acquire(tmp_path / "kv").release()


def test_a_holder_killed_with_sigkill_leaves_no_stale_lock(tmp_path: Path) -> None:
    holder = hold_in_another_process(tmp_path)
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait()
    with FolderLock.acquire(tmp_path) as lock:
        assert (tmp_path / "server.lock").read_text() == f"{os.getpid()}\n"
        with pytest.raises(CacheFolderBusy):  # a second open in this process is refused too
            FolderLock.acquire(tmp_path)
    assert lock.folder == tmp_path
    FolderLock.acquire(tmp_path).release()  # released on leaving the block


def test_a_second_server_on_a_held_folder_exits_2_before_loading_its_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_load(*args: object) -> None:
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(loader, "build_host", no_load)
    folder = cache_root(tmp_path)
    holder = hold_in_another_process(folder)
    try:
        status = cli.main(["serve", "--cache-dir", str(tmp_path), "--port", "1"])
    finally:
        holder.communicate("")
    error = capsys.readouterr().err
    assert status == 2
    assert str(folder) in error and f"pid {holder.pid}" in error and "--cache-dir" in error


def test_the_agents_command_reads_a_held_folder_but_never_deletes_from_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model_root = cache_root(tmp_path) / "tiny-L1-kv1-d1-float32-b8-0123456789ab"
    save_manifest(model_root, AgentManifest("keeper", model_root.name, [], None, 8))
    no_server = ["--cache-dir", str(tmp_path), "--port", "1"]  # nothing listens on port 1
    holder = hold_in_another_process(cache_root(tmp_path))
    try:
        assert cli.main(["agents", "list", *no_server]) == 0
        assert "keeper" in capsys.readouterr().out
        assert cli.main(["agents", "delete", "keeper", *no_server]) == 2
    finally:
        holder.communicate("")
    error = capsys.readouterr().err
    assert f"pid {holder.pid}" in error and "ask the server that holds it" in error
    assert load_manifest(model_root, AgentKey("keeper")) is not None
    assert cli.main(["agents", "delete", "keeper", *no_server]) == 0  # no holder now
    assert load_manifest(model_root, AgentKey("keeper")) is None
