"""What `semantic serve` says while it starts, off a terminal: each load phase with its
duration, then one line that says where it serves and how much the KV pool holds; a second
start that maps the weights the first one prepared; and where a server writes its files."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import pytest

from semantic.backends.torch.kernels import unavailable_reason
from semantic.settings.settings import default_cache_dir
from tests.e2e.conftest import Server

pytestmark = pytest.mark.e2e


def test_the_load_logs_its_phases_and_one_ready_line(server: Server) -> None:
    events = []
    for line in server.log_path.read_text().splitlines():
        try:
            events.append(json.loads(line)["event"])
        except (ValueError, KeyError):
            continue  # a line not of our logger's
    for phase in (
        r"read the config and tokenizer in \d+\.\d s",
        # The first start on this machine converts; later ones map what it prepared.
        r"weights: (\d+ tensors read and converted in \d+\.\d s|prepared ones mapped in "
        r"\d+\.\d\d s from .+\.safetensors)",
        r"loaded smollm2-135m in \d+\.\d s",
    ):
        assert any(re.fullmatch(phase, event) for event in events), phase
    ready = [e for e in events if e.startswith("ready on ")]
    assert len(ready) == 1
    said = re.fullmatch(
        r"ready on (http://127\.0\.0\.1:\d+) \(\d+\.\d s to load\) — ([\d,]+) KV blocks "
        r"\(~([\d,]+) tokens\); API at \1/docs",
        ready[0],
    )
    assert said is not None and said.group(1) == server.url
    assert httpx.get(f"{server.url}/").json()["model"] == "smollm2-135m"


def test_a_second_start_maps_the_weights_the_first_one_prepared(tmp_path: Path) -> None:
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(f"prepared weights are our CPU kernels' layout, and there are none: {reason}")
    # A user cache of its own, sharing only the compiled kernels (a build takes a minute).
    user_cache = tmp_path / "user-cache"
    kernels = default_cache_dir() / "kernels"
    kernels.mkdir(parents=True, exist_ok=True)
    (user_cache / "semantic").mkdir(parents=True)
    (user_cache / "semantic" / "kernels").symlink_to(kernels)
    logs, answers = [], []
    for start in ("first", "second"):
        args = ["--cache-dir", str(tmp_path / start), "--cache-budget-mb", "256"]
        server = Server(args, tmp_path / f"{start}.log", {"XDG_CACHE_HOME": str(user_cache)})
        try:
            server.wait_ready()
            body = {
                "model": "smollm2-135m",
                "prompt": "The capital of France is",
                "max_tokens": 12,
                "temperature": 0,
            }
            reply = httpx.post(f"{server.url}/v1/completions", json=body, timeout=60)
            answers.append(reply.json()["choices"][0]["text"])
        finally:
            server.stop()
        logs.append(server.log_path.read_text())
    assert "tensors read and converted" in logs[0]
    assert "weights: prepared for the next start" in logs[0]
    assert "prepared ones mapped" in logs[1] and "tensors read and converted" not in logs[1]
    assert answers[0] == answers[1] and answers[0]
    assert len(list((user_cache / "semantic" / "prepared").glob("*.safetensors"))) == 1


def test_a_server_writes_only_under_cache_dir_and_the_user_caches_kernels_and_weights(
    tmp_path: Path,
) -> None:
    """A named agent's turn, a stored response, a persist and a stop write under `cache_dir`;
    under the user cache only `kernels/` and `prepared/` (docs/operations.md, "What goes
    outside cache_dir"); nothing in the home folder or the config folder."""
    home, user_cache, config = tmp_path / "home", tmp_path / "user-cache", tmp_path / "config"
    home.mkdir()
    kernels = default_cache_dir() / "kernels"  # shared: a build takes a minute
    kernels.mkdir(parents=True, exist_ok=True)
    (user_cache / "semantic").mkdir(parents=True)
    (user_cache / "semantic" / "kernels").symlink_to(kernels)
    env = {"HOME": str(home), "XDG_CACHE_HOME": str(user_cache), "XDG_CONFIG_HOME": str(config)}
    args = ["--cache-dir", str(tmp_path / "cache"), "--cache-budget-mb", "64"]
    server = Server(args, tmp_path / "server.log", env)
    try:
        server.wait_ready()
        chat = {
            "model": "smollm2-135m",
            "messages": [{"role": "user", "content": "Hello"}],
            "max_tokens": 4,
            "session_id": "writer",
        }
        assert httpx.post(f"{server.url}/v1/chat/completions", json=chat).status_code == 200
        stored = {"model": "smollm2-135m", "input": "Hello", "max_output_tokens": 4}
        assert httpx.post(f"{server.url}/v1/responses", json=stored).status_code == 200
        assert httpx.post(f"{server.url}/admin/cache/persist", json={}).status_code == 200
    finally:
        assert server.stop() == 0, server.log()
    assert list(home.iterdir()) == [] and not config.exists()
    assert {p.name for p in (user_cache / "semantic").iterdir()} <= {"kernels", "prepared"}
    assert list(user_cache.iterdir()) == [user_cache / "semantic"]
    assert any((tmp_path / "cache" / "kv").rglob("agents/**/writer.*.json"))
    assert any((tmp_path / "cache" / "responses").rglob("*"))
