"""The MLX backend end to end: real `semantic serve --backend mlx` processes on SmolLM2, through
the OpenAI and Anthropic SDKs and the admin API — the torch backend's answers, warm turns,
restarts, more agents than the pool holds (K/V in float32 or in 8 bits), and an option it
refuses. On Linux MLX runs its CPU build, slow at matmuls: every prompt here is tens of
tokens."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import Server, Start, started
from tests.e2e.test_agent_cache import (
    CALL_TIMEOUT_S,
    chat,
    computed_tokens,
    conversation,
    restarted_turn_answers_as_cold,
)
from tests.e2e.test_anthropic_api import PARIS, client, text_of
from tests.integration.reference_models import NEEDS_MLX

pytestmark = [pytest.mark.e2e, NEEDS_MLX]

# The default budget would take a quarter of the free memory; 64 MiB holds 5 pages of 256
# tokens in float32 (asked for, so that answers compare exactly with the torch fp32 server's,
# on a Mac's GPU too).
MLX = ("--backend", "mlx", "--dtype", "float32", "--cache-budget-mb", "64")
SYSTEM = "You are the build assistant of a small software team. Be brief."  # ~15 tokens


@pytest.fixture(scope="module")
def mlx_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    server = started(tmp_path_factory.mktemp("mlx-server"), "server", *MLX)
    yield server
    server.stop()


def cache_stats(server: Server) -> dict[str, Any]:
    reply = httpx.get(f"{server.url}/admin/cache", timeout=CALL_TIMEOUT_S)
    reply.raise_for_status()
    return dict(reply.json())


def test_a_greedy_chat_answers_as_the_torch_backend_and_a_warm_turn_reuses_its_history(
    mlx_server: Server, fp32_server: Server
) -> None:
    messages, first = conversation(mlx_server, "parity", 1, SYSTEM)
    reference, _ = conversation(fp32_server, "mlx-parity", 1, SYSTEM)
    assert messages == reference  # the answer, word for word
    messages.append({"role": "user", "content": "And then?"})
    warm = chat(mlx_server, "parity", messages)
    assert warm.usage.prompt_tokens_details.cached_tokens == computed_tokens(first)
    torch_warm = chat(fp32_server, "mlx-parity", messages)
    assert warm.choices[0].message.content == torch_warm.choices[0].message.content


def test_the_anthropic_sdk_streams_every_event_and_creates_the_same_message(
    mlx_server: Server,
) -> None:
    sdk = client(mlx_server)
    with sdk.messages.stream(**PARIS, timeout=CALL_TIMEOUT_S) as stream:
        # The SDK adds a `text` event after each text delta, and drops pings.
        kinds = [kind for kind, _ in itertools.groupby(e.type for e in stream if e.type != "text")]
        streamed = stream.get_final_message()
    assert kinds == [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert "Paris" in text_of(streamed)
    assert streamed.stop_reason in ("end_turn", "max_tokens") and streamed.usage.output_tokens > 0
    prompt = streamed.usage.input_tokens + (streamed.usage.cache_read_input_tokens or 0)
    created = sdk.messages.create(**PARIS, timeout=CALL_TIMEOUT_S)
    assert text_of(created) == text_of(streamed)
    assert created.usage.output_tokens == streamed.usage.output_tokens
    assert created.usage.cache_read_input_tokens == prompt - 1  # all but its last token


def test_after_a_restart_the_first_turn_reads_its_cache_from_disk_and_answers_the_same(
    tmp_path: Path, start: Start
) -> None:
    restarted_turn_answers_as_cold(tmp_path, start, SYSTEM, *MLX)


# 16-token pages of 30 layers × 3 KV heads × 64, K and V in 8 bits with a bf16 scale per token
# and head: 185.6 KiB each, so 2 MiB holds 11, about two agents' first turns (~65 tokens, 5
# pages each) of the three here. 8 bits, so the 8-bit pool's pages go to disk and back too (the
# model-dtype pool's do in the restart test).
def test_more_agents_than_the_pool_holds_take_turns_and_restore_from_disk(
    tmp_path: Path, start: Start
) -> None:
    kv_storage = ("--kv-dtype", "int8", "--cache-budget-mb", "2")
    server = start(tmp_path, "crowd", "--backend", "mlx", "--block-tokens", "16", *kv_storage)
    assert cache_stats(server)["pool"]["blocks_total"] == 11
    agents = [f"crowd-{n}" for n in range(3)]
    with ThreadPoolExecutor(len(agents)) as workers:
        firsts = list(workers.map(lambda a: conversation(server, a, 1, f"{a}: {SYSTEM}"), agents))
        evicted = [
            agent["agent_id"]
            for agent in cache_stats(server)["agents"]
            if agent["bytes_in_memory"] < agent["bytes_full_attention"]
        ]
        assert evicted, "the pool kept every agent: the test proves nothing"
        for messages, _ in firsts:
            messages.append({"role": "user", "content": "And then?"})
        warms = list(workers.map(chat, itertools.repeat(server), agents, (m for m, _ in firsts)))
    for (_, first), warm in zip(firsts, warms, strict=True):
        assert warm.usage.prompt_tokens_details.cached_tokens == computed_tokens(first)
    for agent in evicted:
        stats = httpx.get(f"{server.url}/v1/agents/{agent}", timeout=CALL_TIMEOUT_S).json()
        assert stats["disk_hit_tokens"] > 0, agent
    stats = cache_stats(server)
    pool, totals = stats["pool"], stats["totals"]
    assert pool["running"] == pool["waiting"] == pool["blocks_held"] == 0
    assert pool["blocks_free"] + pool["blocks_cached"] == pool["blocks_total"]
    assert totals["write_errors"] == 0 and totals["quarantined"] == {}
    assert server.stop() == 0
    assert '"level": "error"' not in server.log_path.read_text()


def test_a_device_mlx_does_not_have_is_refused_at_start(tmp_path: Path) -> None:
    refused = Server(
        ["--cache-dir", str(tmp_path / "cache"), *MLX, "--device", "cuda"],
        tmp_path / "refused.log",
    )
    assert refused.process.wait(timeout=120) == 2
    assert "the mlx backend has no device 'cuda'" in refused.log()
    assert "ready on" not in refused.log()
