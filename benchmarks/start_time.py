"""How long `semantic serve` takes to answer `/health/ready`: a first start (the weights are
converted and prepared) and warm starts (the prepared weights are mapped), and each start's
resident memory once ready and after one short chat.

    python benchmarks/start_time.py [--model smollm2-135m] [--warm 5] [--baseline 3]
    python benchmarks/start_time.py --weights int8 --warm 3

`--baseline N` adds N starts with `--no-prepared-weights` (each converts the checkpoint, as every
start did before prepared weights), in the same run.

Each run uses a user cache folder of its own (`XDG_CACHE_HOME`) that shares only the compiled
CPU kernels with the real one, so the first start converts as a new install's would (the kernel
build, a one-time 15-60 s, is not counted), and a KV cache folder of its own per start. Times
are wall clock from the process's spawn to the first 200 of `/health/ready`, polled every 10 ms:
on a shared machine, run it when the machine is quiet. Python writes its compiled modules as
usual, whatever `PYTHONDONTWRITEBYTECODE` says: a second run of an install finds them.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from semantic.settings.settings import default_cache_dir


def start(model: str, user_cache: Path, kv: Path, port: int, *flags: str) -> tuple[float, int, int]:
    """Seconds to ready, and the server's RSS (MiB) when ready and after one chat."""
    command = [sys.executable, "-m", "semantic", "serve", "--model", model, "--port", str(port)]
    command += ["--cache-dir", str(kv), *flags]
    env = {**os.environ, "XDG_CACHE_HOME": str(user_cache)}
    # As an install runs it: Python keeps the modules it compiled (a shell that says otherwise
    # makes every start compile semantic's ~90 modules again, ~0.1 s).
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    started = time.perf_counter()
    process = subprocess.Popen(
        command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    url = f"http://127.0.0.1:{port}"
    try:
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"the server exited with {process.returncode}")
            try:
                if httpx.get(f"{url}/health/ready", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.01)
        ready = time.perf_counter() - started
        rss_ready = _rss_mib(process.pid)
        body = {"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 16}
        httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120).raise_for_status()
        return ready, rss_ready, _rss_mib(process.pid)
    finally:
        process.terminate()
        process.wait(timeout=60)


def _rss_mib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) // 1024
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--warm", type=int, default=5, help="warm starts after the first")
    parser.add_argument("--baseline", type=int, default=0, help="starts that convert, after")
    parser.add_argument("--port", type=int, default=8790)
    parser.add_argument("--weights", default="bf16", help="the servers' weights setting")
    args = parser.parse_args()
    weights = ("--weights", args.weights)
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        kernels = default_cache_dir() / "kernels"
        kernels.mkdir(parents=True, exist_ok=True)
        (root / "user" / "semantic").mkdir(parents=True)
        (root / "user" / "semantic" / "kernels").symlink_to(kernels)
        runs = []
        for index in range(1 + args.warm):
            runs.append(start(args.model, root / "user", root / f"kv{index}", args.port, *weights))
            ready, rss_ready, rss_chat = runs[-1]
            kind = "first" if index == 0 else "warm"
            print(
                f"{kind:5} ready {ready:.2f} s, RSS {rss_ready} MiB ready, {rss_chat} after a chat"
            )
        converting = []
        for index in range(args.baseline):
            kv = root / f"baseline{index}"
            converting.append(
                start(args.model, root / "user", kv, args.port, "--no-prepared-weights", *weights)
            )
            print(f"converting ready {converting[-1][0]:.2f} s")
    print(f"first start: {runs[0][0]:.2f} s to ready")
    _summary("warm starts", runs[1:])
    _summary("starts converting the checkpoint", converting)
    return 0


def _summary(name: str, runs: list[tuple[float, int, int]]) -> None:
    if runs:
        ready, rss = [r[0] for r in runs], statistics.median(r[2] for r in runs)
        print(
            f"{name}: median {statistics.median(ready):.2f} s to ready (min {min(ready):.2f}, "
            f"max {max(ready):.2f}); RSS after a chat: median {rss} MiB"
        )


if __name__ == "__main__":
    raise SystemExit(main())
