"""The agent cache end to end: warm turns, a shared system prompt stored once, restarts, a
kill -9 in the middle of cache writes, other weights under one name, and one server per cache
folder — against real `semantic serve` processes on SmolLM2."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest
from gguf import GGUFReader

from semantic.cache.disk.tier import DiskTier
from semantic.core import CacheSpec
from tests.e2e.conftest import Server, Start

pytestmark = pytest.mark.e2e

SYSTEM = (
    "You are the build assistant of a small software team. You answer questions about the "
    "project's code, its tests and its release process. Be brief and precise. "
) * 24  # about 800 tokens
CALL_TIMEOUT_S = 300  # a hang fails the test, on a loaded machine too


def chat(server: Server, agent: str, messages: list[dict[str, str]], **extra: Any) -> Any:
    sdk = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    return sdk.chat.completions.create(
        model="smollm2-135m",
        messages=messages,  # type: ignore[arg-type]
        temperature=0,
        max_tokens=24,
        timeout=CALL_TIMEOUT_S,
        extra_body={"session_id": agent, **extra},
    )


def conversation(
    server: Server, agent: str, turns: int, system: str = SYSTEM
) -> tuple[list[dict[str, str]], Any]:
    """Run `turns` turns; returns the messages so far (ending with the last answer) and the
    last response."""
    messages = [{"role": "system", "content": system}]
    answer = None
    for turn in range(turns):
        messages.append({"role": "user", "content": f"Question {turn}: what should I test first?"})
        answer = chat(server, agent, messages)
        messages.append({"role": "assistant", "content": answer.choices[0].message.content})
    return messages, answer


def computed_tokens(reply: Any) -> int:
    """The tokens a turn leaves in its agent's cache: the prompt and the answer but for the
    answer's last token, which the model sampled and never read."""
    return int(reply.usage.prompt_tokens + reply.usage.completion_tokens - 1)


def test_a_warm_turn_reuses_the_whole_history(server: Server) -> None:
    messages, last = conversation(server, "warm-agent", 2)
    messages.append({"role": "user", "content": "And then?"})
    warm = chat(server, "warm-agent", messages)
    history = computed_tokens(last)
    assert warm.usage.prompt_tokens_details.cached_tokens == history
    stats = httpx.get(f"{server.url}/v1/agents/warm-agent").json()
    assert stats["requests"] == 3 and stats["hit_tokens"] >= history


def test_ten_agents_share_one_copy_of_their_system_prompt(tmp_path: Path, start: Start) -> None:
    server = start(tmp_path, "shared")
    try:
        prompt_tokens = 0
        for agent in range(10):
            messages = [
                {"role": "system", "content": SYSTEM},
                {"role": "user", "content": f"I am agent {agent}. Say hello."},
            ]
            reply = chat(server, f"agent-{agent}", messages)
            prompt_tokens = reply.usage.prompt_tokens
            if agent:
                assert reply.usage.prompt_tokens_details.cached_tokens >= 768  # 3 full blocks
        shared_blocks = (prompt_tokens - 20) // 256  # the system prompt's full blocks
        persisted = httpx.post(f"{server.url}/admin/cache/persist", timeout=60).json()
        stats = httpx.get(f"{server.url}/admin/cache").json()
        # Each agent adds only its own partial tail to the shared full blocks: once in memory...
        assert stats["pool"]["blocks_cached"] == shared_blocks + 10
        # ...and once on disk.
        assert stats["totals"]["disk_files"] == shared_blocks + 10
        assert persisted["failed"] == 0 and persisted["agents_saved"] == 10
    finally:
        assert server.stop() == 0


def test_after_a_restart_the_first_turn_reads_its_cache_from_disk_and_answers_the_same(
    tmp_path: Path, start: Start
) -> None:
    # fp32: an exact comparison with a cold server, no bf16 near-ties
    restarted_turn_answers_as_cold(tmp_path, start, SYSTEM, "--dtype", "float32")


def restarted_turn_answers_as_cold(tmp_path: Path, start: Start, system: str, *flags: str) -> None:
    """Two turns of an agent, a SIGTERM (which persists every hot cache), then its third turn
    on a restarted server: most of the prompt read from disk, and the answer a cold server
    (`flags` both) gives."""
    server = start(tmp_path / "warm", "before", *flags)
    messages, _ = conversation(server, "returning", 2, system)
    assert server.stop() == 0  # SIGTERM: graceful, persists every hot cache
    messages.append({"role": "user", "content": "Summarize that in one line."})
    restarted = start(tmp_path / "warm", "after", *flags)
    try:
        warm = chat(restarted, "returning", messages)
        stats = httpx.get(f"{restarted.url}/v1/agents/returning").json()
    finally:
        restarted.stop()
    assert warm.usage.prompt_tokens_details.cached_tokens > 0.8 * warm.usage.prompt_tokens
    assert stats["disk_hit_tokens"] == warm.usage.prompt_tokens_details.cached_tokens
    cold = start(tmp_path / "cold", "cold", *flags)
    try:
        reference = chat(cold, "returning", messages)
    finally:
        cold.stop()
    assert reference.usage.prompt_tokens_details.cached_tokens == 0
    assert warm.choices[0].message.content == reference.choices[0].message.content


def test_kill_9_during_cache_writes_loses_nothing_acknowledged(
    tmp_path: Path, start: Start
) -> None:
    # A pool of ~10 blocks: every new agent evicts others' blocks while it runs, and its own are
    # written behind its turn.
    server = start(tmp_path, "doomed", "--cache-budget-mb", "60")
    messages, _ = conversation(server, "keeper", 1)
    acknowledged = httpx.post(
        f"{server.url}/admin/cache/persist", json={"agents": ["keeper"]}, timeout=60
    ).json()
    assert acknowledged["agents_saved"] == 1
    churn = threading.Thread(target=_churn, args=(server,), daemon=True)
    churn.start()
    deadline = time.monotonic() + 300
    # /admin/cache waits for the engine's step in flight: a long one on a loaded machine.
    while _blocks_written(server) < 2:
        assert time.monotonic() < deadline, "the churn never wrote anything"
        assert churn.is_alive(), f"the churn stopped before any write:\n{server.log()}"
        time.sleep(0.05)
    os.kill(server.process.pid, signal.SIGKILL)  # blocks are being written right now
    server.process.wait()
    churn.join(timeout=60)
    blocks = next((tmp_path / "cache" / "kv").glob("*/blocks"))
    survivors = start(tmp_path, "survivor")
    try:
        assert not [p for p in blocks.iterdir() if p.name.endswith(".tmp")]
        messages.append({"role": "user", "content": "Anything else?"})
        reply = chat(survivors, "keeper", messages)
        assert reply.usage.prompt_tokens_details.cached_tokens > 700
        # httpx's default 5 s is too short for a loaded machine (seen at load 4).
        stats = httpx.get(f"{survivors.url}/admin/cache", timeout=60).json()
        assert stats["totals"]["quarantined"] == {}
        models = httpx.get(f"{survivors.url}/admin/models", timeout=60).json()
    finally:
        survivors.stop()
    _every_block_file_reads_back(blocks.parent, models["loaded"]["cache_spec"])


def _blocks_written(server: Server) -> int:
    """Blocks written while serving: evicted, or behind the churning agents' turns (each of
    their blocks is on disk before the pool evicts it)."""
    totals = httpx.get(f"{server.url}/admin/cache", timeout=60).json()["totals"]
    return int(totals["evicted_to_disk"] + totals["written_behind"])


def _churn(server: Server) -> None:
    """New agents with prompts of their own (nothing shared) until the server dies. Any other
    API error ends the churn too, and shows in the server's log."""
    for agent in range(50):
        try:
            conversation(server, f"churn-{agent}", 1, system=f"Agent {agent}. {SYSTEM}")
        except openai.APIError:
            return


def _every_block_file_reads_back(model_root: Path, tag: str) -> None:
    """Open the folder as the server would (its cache spec's `tag`, SmolLM2's in bf16, or fp32
    on a CPU without bf16, with K/V in the model's dtype or 8 bits) and read every block: none
    may fail its checks."""
    specs = (
        CacheSpec(30, 3, 64, dtype, 256, kv_dtype=kv)
        for dtype in ("bfloat16", "float32")
        for kv in (None, "int8")
    )
    spec = next(spec for spec in specs if spec.tag() == tag)
    tier = DiskTier(model_root.parent, model_tag=model_root.name, spec=spec, budget_bytes=2**40)
    hashes = [int(p.stem, 16) for p in (model_root / "blocks").glob("*.safetensors")]
    assert hashes and all(tier.read(h) is not None for h in hashes)
    assert tier.stats.quarantined == {}


def test_the_agents_command_lists_and_deletes_through_the_server(server: Server) -> None:
    conversation(server, "short-lived", 1)
    base = [sys.executable, "-m", "semantic", "agents", "--port", str(server.port)]
    listed = subprocess.run([*base, "list"], capture_output=True, text=True, check=True)
    assert "short-lived" in listed.stdout
    subprocess.run([*base, "delete", "short-lived"], capture_output=True, text=True, check=True)
    assert httpx.get(f"{server.url}/v1/agents/short-lived").status_code == 404


def _tuned_copy(model: Path, destination: Path) -> Path:
    """A copy of the GGUF `model` with its final norm scaled by 1.01: a model of the same shape
    whose other weights change its KV, as a fine-tune's do."""
    shutil.copy(model, destination)
    [norm] = [t for t in GGUFReader(destination).tensors if t.name == "output_norm.weight"]
    weights = np.memmap(destination, np.float32, "r+", norm.data_offset, norm.n_elements)
    weights *= 1.01
    weights.flush()
    return destination


def test_a_second_file_of_one_shape_under_one_served_name_does_not_reuse_the_cache(
    tmp_path: Path, start: Start, smollm2_path: Path
) -> None:
    """`--served-model-name` kept while `--model` changes to other weights of the same shape:
    the first file's cache is a miss for the second, and still a hit for the first."""
    tuned = _tuned_copy(smollm2_path, tmp_path / "tuned.gguf")
    named = ("--served-model-name", "assistant")
    first = start(tmp_path, "first", "--model", str(smollm2_path), *named)
    messages, _ = conversation(first, "returning", 1)
    assert first.stop() == 0  # persists the agent's cache
    messages.append({"role": "user", "content": "Summarize that in one line."})
    second = start(tmp_path, "second", "--model", str(tuned), *named)
    try:
        other = chat(second, "returning", messages)
    finally:
        assert second.stop() == 0
    assert other.usage.prompt_tokens_details.cached_tokens == 0
    again = start(tmp_path, "again", "--model", str(smollm2_path), *named)
    try:
        warm = chat(again, "returning", messages)
    finally:
        again.stop()
    assert warm.usage.prompt_tokens_details.cached_tokens > 0.8 * warm.usage.prompt_tokens
    assert len(list((tmp_path / "cache" / "kv").glob("assistant-*"))) == 2


def test_a_second_server_on_one_cache_folder_exits_at_once_naming_the_first(
    tmp_path: Path, start: Start
) -> None:
    """The second fails before it loads a model, with the folder and the first one's pid; the
    agents command, finding no server at its port, does not delete from the held folder."""
    first = start(tmp_path, "first")
    conversation(first, "keeper", 1)
    httpx.post(f"{first.url}/admin/cache/persist", timeout=60).raise_for_status()
    second = Server(["--cache-dir", str(tmp_path / "cache")], tmp_path / "second.log")
    assert second.process.wait(timeout=120) == 2
    refusal = second.log()
    assert str(tmp_path / "cache" / "kv") in refusal and f"pid {first.process.pid}" in refusal
    assert "loading" not in refusal  # refused before the model loads
    offline = [sys.executable, "-m", "semantic", "agents", "--cache-dir", str(tmp_path / "cache")]
    deleted = subprocess.run(
        [*offline, "--port", str(second.port), "delete", "keeper"], capture_output=True, text=True
    )
    assert deleted.returncode == 2 and f"pid {first.process.pid}" in deleted.stderr
    try:
        assert httpx.get(f"{first.url}/v1/agents/keeper", timeout=30).status_code == 200
        assert httpx.get(f"{first.url}/health/ready", timeout=30).status_code == 200
    finally:
        assert first.stop() == 0
    assert len(list((tmp_path / "cache" / "kv").glob("*/agents/none/keeper.*.json"))) == 1
