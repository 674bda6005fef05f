"""How a bench run reaches the server it measures: the base URL as given, an HTTP client with
the run's key and enough connections for its streams, and a spawned `semantic serve` waited on
until it is ready."""

from __future__ import annotations

from pathlib import Path

import httpx

from semantic_bench.options import BenchOptions
from semantic_bench.progress import PhaseProgress
from semantic_bench.server import SpawnedServer

READY_TIMEOUT_S = 600.0  # a cold start may load weights and warm caches from disk
SPARE_CONNECTIONS = 4  # beyond one per stream: the cache counters' reads, a stray retry


def normalize_base_url(url: str) -> str:
    """Accept both `http://host:port` and the OpenAI-SDK style `http://host:port/v1`."""
    return url.rstrip("/").removesuffix("/v1")


def given_url(options: BenchOptions) -> str:
    """The target's URL when the run was given one (`options.spawns` is False)."""
    return normalize_base_url(options.base_url or "")


def open_client(base_url: str, options: BenchOptions, streams: int) -> httpx.AsyncClient:
    """A client for `streams` requests at once: with fewer connections, the extra requests
    would queue in the client and the server would never see them all together."""
    headers = {"Authorization": f"Bearer {options.api_key}"} if options.api_key else {}
    # A generous read timeout: on a CPU, many agents' cold prefills can take minutes.
    timeout = httpx.Timeout(600.0, connect=10.0)
    limits = httpx.Limits(max_connections=streams + SPARE_CONNECTIONS)
    return httpx.AsyncClient(base_url=base_url, headers=headers, timeout=timeout, limits=limits)


def start_server(
    options: BenchOptions, server_args: list[str], cache_dir: Path, progress: PhaseProgress
) -> SpawnedServer:
    """`semantic serve` on `cache_dir`, ready to answer; stopped again if it never gets there."""
    server = SpawnedServer.start(options.model, server_args, cache_dir)
    try:
        with progress.waiting(f"starting semantic serve at {server.base_url}"):
            server.wait_ready(READY_TIMEOUT_S)
    except BaseException:
        server.stop()
        raise
    return server
