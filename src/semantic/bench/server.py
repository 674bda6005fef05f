"""The `semantic serve` child process a bench run spawns when it is given no base URL: start it
on a free port, wait until it is ready, read its peak memory, and stop it with SIGTERM."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import httpx

from semantic.bench.workload import BenchError

HOST = "127.0.0.1"


def peak_rss_bytes(pid: int) -> int | None:
    """Peak resident memory (VmHWM) of a live process; None where /proc cannot tell (not Linux,
    process gone)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    for line in status.splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024  # the kernel reports kB
    return None


def free_port() -> int:
    # Another process may take it before the server binds; rare enough on a bench machine.
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


@dataclass(slots=True)
class SpawnedServer:
    """One `python -m semantic serve` child. Its output goes to a temporary file rather than the
    terminal (it would tear through the progress display); the tail is shown if it fails."""

    process: subprocess.Popen[bytes]
    base_url: str
    log: IO[bytes]

    @classmethod
    def start(cls, model: str, server_args: list[str]) -> SpawnedServer:
        port = free_port()
        command = [sys.executable, "-m", "semantic", "serve", "--host", HOST, "--port", str(port)]
        command += ["--model", model, *server_args]
        log = tempfile.TemporaryFile()  # noqa: SIM115 -- lives as long as the child; stop() closes it
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        return cls(process, f"http://{HOST}:{port}", log)

    def wait_ready(self, timeout_s: float) -> None:
        """Poll `GET /health/ready` until 200; fail fast if the child exits first."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise BenchError(
                    f"semantic serve exited with {self.process.returncode}:\n{self.log_tail()}"
                )
            if self._ready():
                return
            time.sleep(0.25)
        raise BenchError(f"semantic serve not ready after {timeout_s:.0f} s:\n{self.log_tail()}")

    def _ready(self) -> bool:
        try:
            return httpx.get(f"{self.base_url}/health/ready", timeout=2.0).status_code == 200
        except httpx.TransportError:
            return False  # not listening yet

    def peak_rss_bytes(self) -> int | None:
        """Read while the child is alive: /proc forgets it once it exits."""
        return peak_rss_bytes(self.process.pid)

    def stop(self, timeout_s: float = 60.0) -> None:
        """SIGTERM (graceful: the server persists its caches), then SIGKILL after `timeout_s`."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()

    def log_tail(self, chars: int = 4000) -> str:
        # pread leaves the offset alone: the child shares it and may still be writing.
        fd = self.log.fileno()
        size = os.fstat(fd).st_size
        return os.pread(fd, chars, max(0, size - chars)).decode(errors="replace")
