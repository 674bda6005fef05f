"""The `semantic serve` child process a bench run spawns when it is given no base URL: start it
on a free port with its own cache folder, wait until it is ready, read its peak memory, restart
it on the same folder, and stop it with SIGTERM; and the KV bytes per token it will hold."""

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

from semantic.backends import default_backend
from semantic.core import CacheSpec
from semantic.errors import InvalidSettings
from semantic.models.config import ModelConfig
from semantic.settings.errors import load_settings
from semantic.settings.flags import Parser, add_settings_flags, given_settings
from semantic.settings.settings import Settings
from semantic_bench.errors import BenchError

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


@dataclass(slots=True, frozen=True)
class RestartTiming:
    """One restart: SIGTERM until the old process exited (it persists its caches on the way
    out), and start until `/health/ready`."""

    stop_s: float
    ready_s: float
    exit_code: int  # 0 for a graceful shutdown; anything else means the caches may be lost


@dataclass(slots=True)
class SpawnedServer:
    """One `python -m semantic serve` child (one at a time: `restart` replaces it on the same
    port and cache folder). Its output goes to a temporary file rather than the terminal (it
    would tear through the progress display); the tail is shown if it fails."""

    process: subprocess.Popen[bytes]
    base_url: str
    log: IO[bytes]
    command: list[str]
    earlier_peak_bytes: int | None = None  # of the processes a restart replaced

    @classmethod
    def start(cls, model: str, server_args: list[str], cache_dir: Path) -> SpawnedServer:
        """`cache_dir` comes before `server_args`, so a `--cache-dir` given there wins."""
        port = free_port()
        command = [sys.executable, "-m", "semantic", "serve", "--host", HOST, "--port", str(port)]
        command += ["--model", model, "--cache-dir", str(cache_dir), *server_args]
        log = tempfile.TemporaryFile()  # noqa: SIM115 -- lives as long as the child; stop() closes it
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        return cls(process, f"http://{HOST}:{port}", log, command)

    def restart(self, ready_timeout_s: float) -> RestartTiming:
        """SIGTERM, wait for the exit, start the same command again, wait until ready."""
        self.earlier_peak_bytes = self.peak_rss_bytes()
        started = time.perf_counter()
        exit_code = self._terminate(timeout_s=120.0)
        stopped = time.perf_counter()
        self.process = subprocess.Popen(self.command, stdout=self.log, stderr=subprocess.STDOUT)
        self.wait_ready(ready_timeout_s)
        return RestartTiming(stopped - started, time.perf_counter() - stopped, exit_code)

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
        """The highest of this child's and those it replaced. Read while the child is alive:
        /proc forgets it once it exits."""
        peaks = [p for p in (peak_rss_bytes(self.process.pid), self.earlier_peak_bytes) if p]
        return max(peaks, default=None)

    def stop(self, timeout_s: float = 60.0) -> None:
        self._terminate(timeout_s)
        self.log.close()

    def _terminate(self, timeout_s: float) -> int:
        """SIGTERM (graceful: the server persists its caches), then SIGKILL after `timeout_s`;
        returns the exit code."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode

    def log_tail(self, chars: int = 4000) -> str:
        # pread leaves the offset alone: the child shares it and may still be writing.
        fd = self.log.fileno()
        size = os.fstat(fd).st_size
        return os.pread(fd, chars, max(0, size - chars)).decode(errors="replace")


def kv_bytes_per_token(model: str, server_args: list[str]) -> int:
    """K and V of one token in every layer, as a spawned server of `model` holds them: the
    model's geometry, in the dtype and KV dtype the server's settings (`server_settings`) pick on
    this machine, on its backend. SmolLM2-135M in bf16: 2 · 30 layers · 3 heads · 64 · 2 =
    23,040; in int8, 2 · 30 · 3 · (64 + a 2-byte scale) = 11,880."""
    from semantic.models.checkpoint import load_checkpoint
    from semantic.models.registry import ModelRegistry

    settings = server_settings(server_args)
    config = load_checkpoint(ModelRegistry().resolve(model).path, progress=False).config
    dtype, kv_dtype = _kv_numerics(settings, config)
    # Every layer's K and V, whichever window it reads: the windows do not change a block's size.
    spec = CacheSpec.of_model(config, (), dtype=dtype, block_tokens=1, kv_dtype=kv_dtype)
    return spec.bytes_per_block


def _kv_numerics(settings: Settings, config: ModelConfig) -> tuple[str, str | None]:
    """The pool's dtype and KV dtype a server with `settings` picks, by its backend's rules."""
    backend = default_backend() if settings.backend == "auto" else settings.backend
    if backend == "mlx":
        from semantic.backends.mlx import runner as mlx

        dtype = mlx.pick_dtype(settings.dtype, mlx.pick_device(settings.device))
        return dtype, mlx.pick_kv_dtype(settings.kv_dtype)
    from semantic.backends.torch.runner import (  # imports torch
        attention_kernels,
        pick_cpu_kernels,
        pick_device,
        pick_dtype,
        pick_kv_dtype,
    )

    device = pick_device(settings.device)
    torch_dtype = pick_dtype(settings.dtype, device)
    cpu = pick_cpu_kernels(settings.cpu_kernels, device, torch_dtype)
    in_place = attention_kernels(cpu, config, torch_dtype) is not None
    kv_dtype = pick_kv_dtype(settings.kv_dtype, in_place, torch_dtype)
    return str(torch_dtype).removeprefix("torch."), kv_dtype


def server_block_tokens(server_args: list[str]) -> int:
    """Tokens per KV block of a spawned server."""
    return server_settings(server_args).block_tokens


def server_settings(server_args: list[str]) -> Settings:
    """The settings `semantic serve` starts with given `server_args`: those flags over the
    environment, `.env` and the config file, as the server itself reads them."""
    parser = Parser(prog="semantic serve", add_help=False)
    add_settings_flags(parser)
    try:
        return load_settings(given_settings(parser.parse_args(server_args)))
    except SystemExit:  # argparse has said what is wrong on stderr
        raise BenchError(f"the server's arguments are not valid: {' '.join(server_args)}") from None
    except InvalidSettings as exc:
        raise BenchError(f"the server's settings: {exc}") from None


def flag_value(args: list[str], flag: str) -> str | None:
    """The last value given for `flag` (`--flag value` or `--flag=value`), as argparse reads it."""
    value = None
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            value = args[i + 1]
        elif arg.startswith(flag + "="):
            value = arg.split("=", 1)[1]
    return value
