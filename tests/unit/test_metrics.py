"""/metrics over the fake runner: every metric of the catalog (docs/operations.md), with values
that match what was sent, what the runner ran, and what /admin/cache says."""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable
from pathlib import Path

from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from semantic.api.app import create_app
from semantic.core import AgentKey
from semantic.models.served import ServedModel
from tests.unit.fakes import make_engine, running

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]

MESSAGE = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "Hello"}]}
CHAT = {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "Hi there"}]}
OPERATIONS = Path(__file__).parents[2] / "docs" / "operations.md"


def scrape(client: TestClient, **headers: str) -> Samples:
    """Every sample of /metrics by name and labels (parsing it also checks the format)."""
    response = client.get("/metrics", headers=headers)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=")
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, frozenset(labels.items()))]


def completion(client: TestClient, prompt: list[int], agent: str | None = None) -> None:
    body = {"model": "m", "prompt": prompt, "max_tokens": 2, "temperature": 0}
    response = client.post("/v1/completions", json=body | ({"session_id": agent} if agent else {}))
    assert response.status_code == 200, response.text


def test_metrics_count_the_requests_tokens_and_steps_that_ran(
    chat_served: ServedModel, tmp_path: Path
) -> None:
    with running(chat_served, tmp_path) as (client, _, runner):
        for _ in range(3):
            sent = client.post("/v1/messages", json=MESSAGE, headers={"x-session-id": "ann"})
            assert sent.status_code == 200
        for stream in (False, True):
            body = CHAT | {"session_id": "bob", "stream": stream}
            assert client.post("/v1/chat/completions", json=body).status_code == 200
        assert client.post("/v1/messages", json=MESSAGE | {"messages": []}).status_code == 400
        assert client.get("/no/such/route").status_code == 404
        samples = scrape(client)
        cache = client.get("/admin/cache").json()["totals"]

    assert value(samples, "semantic_requests_total", route="/v1/messages", status="200") == 3
    assert value(samples, "semantic_requests_total", route="/v1/messages", status="400") == 1
    assert (
        value(samples, "semantic_requests_total", route="/v1/chat/completions", status="200") == 2
    )
    assert value(samples, "semantic_requests_total", route="unmatched", status="404") == 1
    assert value(samples, "semantic_request_duration_seconds_count", route="/v1/messages") == 4
    # once per request that produced a token; the 400 never reached the engine
    assert value(samples, "semantic_time_to_first_token_seconds_count") == 5
    assert value(samples, "semantic_time_to_first_token_seconds_sum") > 0
    assert value(samples, "semantic_generated_tokens_total") == 3 * 5 + 2 * 4
    steps = runner.steps
    assert value(samples, "semantic_step_sequences_count") == len(steps)
    assert value(samples, "semantic_step_sequences_sum") == sum(len(s.items) for s in steps)
    assert value(samples, "semantic_step_tokens_sum") == sum(
        len(item.token_ids) for step in steps for item in step.items
    )
    assert value(samples, "semantic_requests_running") == 0
    assert value(samples, "semantic_requests_waiting") == 0
    assert value(samples, "semantic_agents", state="active") == 2
    assert value(samples, "semantic_model_info", model=chat_served.name) == 1
    # the fake runner never samples the end token, so each answer ran to max_tokens
    assert cache["hit_tokens_memory"] > 0 and cache["miss_tokens"] > 0
    assert (
        value(samples, "semantic_cache_hit_tokens_total", tier="memory")
        == cache["hit_tokens_memory"]
    )
    assert value(samples, "semantic_cache_hit_tokens_total", tier="disk") == 0
    assert value(samples, "semantic_cache_miss_tokens_total") == cache["miss_tokens"]
    for reason, count in cache["miss_reasons"].items():
        assert value(samples, "semantic_cache_miss_requests_total", reason=reason) == count


def test_pool_and_memory_metrics_add_up_to_the_pool(served: ServedModel, tmp_path: Path) -> None:
    with running(served, tmp_path) as (client, engine, _):
        completion(client, list(range(3, 40)))
        samples = scrape(client)
    states = [value(samples, "semantic_pool_blocks", state=s) for s in ("held", "cached", "free")]
    assert sum(states) == engine.pool.num_blocks
    assert states[1] > 0  # the finished prompt stays cached
    bytes_per_block = engine.runner.cache_spec.bytes_per_block
    assert value(samples, "semantic_kv_pool_bytes") == engine.pool.num_blocks * bytes_per_block
    if sys.platform == "linux":  # prometheus_client reads /proc
        assert value(samples, "process_resident_memory_bytes") > 0


def test_evictions_writes_and_disk_hits_match_admin_cache_by_tier(
    served: ServedModel, tmp_path: Path
) -> None:
    history = [3 + (k * 7) % 380 for k in range(40)]
    with running(served, tmp_path, num_blocks=12) as (client, _, _):
        completion(client, history, agent="alice")
        for other in range(4):  # other agents push alice's blocks out of the pool
            completion(client, [100 + other] * 60, agent=f"other-{other}")
        assert client.post("/admin/cache/persist").status_code == 200  # flushes eviction writes
        completion(client, [*history, 300], agent="alice")  # read back from disk
        assert client.post("/admin/cache/persist").status_code == 200  # flushes the write-behind
        samples = scrape(client)
        cache = client.get("/admin/cache").json()["totals"]

    by_tier = {
        tier: value(samples, "semantic_pool_evicted_blocks_total", eviction_tier=tier)
        for tier in ("one_off", "idle_agent", "working_agent", "shared")
    }
    assert by_tier["working_agent"] > 0
    memory = value(samples, "semantic_cache_evicted_blocks_total", tier="memory")
    assert memory == sum(by_tier.values())
    assert value(samples, "semantic_cache_evicted_blocks_total", tier="disk") == 0
    written = {
        reason: value(samples, "semantic_cache_written_blocks_total", reason=reason)
        for reason in ("eviction", "persist", "write_behind")
    }
    assert written["eviction"] == cache["evicted_to_disk"] <= memory
    assert written["persist"] == cache["persisted"]
    assert written["write_behind"] == cache["written_behind"]
    # alice's blocks were on disk before they left memory: written behind her turn, or evicted
    assert written["eviction"] + written["write_behind"] > 0
    assert value(samples, "semantic_cache_write_errors_total") == 0
    disk_hits = value(samples, "semantic_cache_hit_tokens_total", tier="disk")
    assert disk_hits > 0 and disk_hits == cache["hit_tokens_disk"]
    assert value(samples, "semantic_cache_disk_bytes") == cache["disk_bytes"] > 0
    assert value(samples, "semantic_cache_disk_files") == cache["disk_files"]
    assert value(samples, "semantic_cache_persist_duration_seconds_count") == 2
    assert value(samples, "semantic_agents", state="active") == 5


def test_routes_are_labelled_by_their_template_never_the_raw_path(
    served: ServedModel, tmp_path: Path
) -> None:
    with running(served, tmp_path) as (client, _, _):
        for name in ("ghost-1", "ghost-2"):
            assert client.get(f"/v1/agents/{name}").status_code == 404
        assert client.put("/v1/agents/ghost-1").status_code == 405
        samples = scrape(client)
    routes = {dict(labels).get("route") for name, labels in samples if "requests_total" in name}
    assert (
        value(samples, "semantic_requests_total", route="/v1/agents/{agent_id}", status="404") == 2
    )
    assert (
        value(samples, "semantic_requests_total", route="/v1/agents/{agent_id}", status="405") == 1
    )
    assert not any(route and "ghost" in route for route in routes)


def test_every_metric_is_in_the_operations_guide(served: ServedModel, tmp_path: Path) -> None:
    with running(served, tmp_path) as (client, _, _):
        client.get("/health/live")
        text = client.get("/metrics").text
    exposed = {
        f.name for f in text_string_to_metric_families(text) if f.name.startswith("semantic_")
    }
    documented = re.findall(r"`(semantic_\w+)`", OPERATIONS.read_text())
    assert family_names(exposed) == family_names(documented)
    assert "semantic_model_swap_duration_seconds" in family_names(
        exposed
    )  # the hot swap observes it


def family_names(names: Iterable[str]) -> set[str]:
    """Sample names without the suffixes Prometheus adds to a family's name."""
    return {re.sub(r"_(total|count|sum|bucket|created)$", "", name) for name in names}


def test_metrics_need_a_key_when_keys_are_set(served: ServedModel, tmp_path: Path) -> None:
    with running(served, tmp_path, api_key=["sk-metrics"]) as (client, _, _):
        assert client.get("/metrics").status_code == 401
        samples = scrape(client, **{"x-api-key": "sk-metrics"})
    assert value(samples, "semantic_requests_total", route="/metrics", status="401") == 1


def test_each_app_counts_only_its_own_requests(served: ServedModel, tmp_path: Path) -> None:
    with (
        running(served, tmp_path / "one") as (first, _, _),
        running(served, tmp_path / "two") as (second, _, _),
    ):
        first.get("/health/live")
        first.get("/health/live")
        second.get("/health/live")
        one, two = scrape(first), scrape(second)
    assert value(one, "semantic_requests_total", route="/health/live", status="200") == 2
    assert value(two, "semantic_requests_total", route="/health/live", status="200") == 1


def test_without_the_engine_thread_metrics_still_answer(
    served: ServedModel, tmp_path: Path
) -> None:
    engine, _ = make_engine(served, tmp_path)
    client = TestClient(create_app(engine, engine.settings))  # no lifespan: no engine thread
    samples = scrape(client)
    assert ("semantic_generated_tokens_total", frozenset()) in samples
    assert not any(name == "semantic_pool_blocks" for name, _ in samples)


def test_admin_evict_moves_caches_to_disk_and_counts_as_memory_evictions(
    served: ServedModel, tmp_path: Path
) -> None:
    history = [3 + (k * 7) % 380 for k in range(40)]
    with running(served, tmp_path) as (client, engine, _):
        completion(client, history, agent="alice")
        held = len(engine.agents.by_key[AgentKey("alice")].hashes)
        answer = client.post("/admin/cache/evict", json={"agents": ["alice"]})
        assert answer.status_code == 200, answer.text
        assert answer.json()["blocks_evicted"] == held
        assert answer.json()["persisted"]["agents_saved"] == 1
        assert client.post("/admin/cache/evict", json={"agents": "alice"}).status_code == 400
        completion(client, [*history, 300], agent="alice")
        samples = scrape(client)
    assert value(samples, "semantic_cache_evicted_blocks_total", tier="memory") == held
    assert value(samples, "semantic_cache_hit_tokens_total", tier="disk") == len(history)
