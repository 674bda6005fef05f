"""The crowd phase against the fake SSE server: every agent at once, named and anonymous
clients, its hit-rate and prefilled ÷ new arithmetic, the server's cache counters over the run
(or "unknown" without them), a failed request counted without ending the phase, the pool it
sizes, its flags, and its section of the report."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import importlib.util
import json
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from semantic_bench import workload
from semantic_bench.cache_counters import CacheCounters, counters_over
from semantic_bench.cli import add_bench_arguments, options_from_args
from semantic_bench.conversation import Chat
from semantic_bench.crowd import CrowdResult, CrowdRun, CrowdTurn, run_crowd
from semantic_bench.errors import BenchError
from semantic_bench.options import BenchOptions, Clients, Phase
from semantic_bench.plan import WorkloadSpec, build_plan
from semantic_bench.pool_phases import crowd_budget
from semantic_bench.pressure import PoolBudget, pool_budget
from semantic_bench.report import BenchResult, to_json, to_markdown
from semantic_bench.run import run_bench
from semantic_bench.server import kv_bytes_per_token, server_block_tokens
from tests.unit.bench_records import bench_result
from tests.unit.test_bench_fakeserver import (
    TOKENS_PER_WORD,
    FakeServer,
    fresh_totals,
    running,
)

SPEC = WorkloadSpec(agents=3, turns=3, system_tokens=30, user_tokens=8, max_tokens=4)


def _crowd(
    fake: FakeServer,
    clients: Clients,
    spec: WorkloadSpec = SPEC,
    step: Callable[[str], None] = lambda note: None,
) -> CrowdRun:
    async def main() -> CrowdRun:
        async with httpx.AsyncClient(base_url=fake.url, timeout=10) as client:
            plan = build_plan(spec, TOKENS_PER_WORD, "crowd")
            return await run_crowd(Chat(client, "m", plan), spec, clients, None, step)

    return asyncio.run(main())


@pytest.fixture
def fake() -> Iterator[FakeServer]:
    """A fresh fake per test (its counters and in-flight peak are the test's own), which holds
    every request until all of a crowd's first turns are in flight at once."""
    with running(FakeServer(hold_until=SPEC.agents)) as server:
        yield server


def test_every_agent_is_in_flight_at_once_and_sends_its_turns_in_order(fake: FakeServer) -> None:
    notes: list[str] = []
    run = _crowd(fake, Clients.NAMED, step=notes.append)
    assert fake.peak_in_flight == SPEC.agents  # a sequential client would have peaked at 1
    assert len(notes) == len(run.turns) == SPEC.agents * SPEC.turns and run.errors == []
    for agent in range(SPEC.agents):
        mine = [b for b in fake.bodies if b["session_id"].endswith(f"crowd-named-{agent}")]
        assert [len(b["messages"]) for b in mine] == [2, 4, 6]  # each turn resends the last
    assert [(t.agent, t.turn) for t in run.turns] == [
        (a, t) for a in range(SPEC.agents) for t in range(SPEC.turns)
    ]
    for agent in range(SPEC.agents):  # each turn is sent after the previous answer came
        sent = [t.sent_s for t in run.turns if t.agent == agent]
        assert sent == sorted(sent) and sent[0] >= 0


def test_anonymous_clients_send_no_session_id_yet_warm_turns_find_their_history(
    fake: FakeServer,
) -> None:
    run = _crowd(fake, Clients.ANONYMOUS)
    assert fake.bodies and not any("session_id" in body for body in fake.bodies)
    assert run.clients is Clients.ANONYMOUS and fake.peak_in_flight == SPEC.agents
    assert run.hit_rate is not None and run.hit_rate > 0.8  # the fake caches prompts only


def _turn(agent: int, turn: int, history: int, prompt: int, cached: int | None) -> CrowdTurn:
    return CrowdTurn(agent, turn, history, 0.1 * (agent + 1) * (turn + 1), prompt, 4, cached)


def test_hit_rate_is_cached_over_history_and_prefill_is_prefilled_over_new_on_warm_turns() -> None:
    turns = [
        _turn(0, 0, 0, 1000, 0),  # cold: in neither ratio
        _turn(1, 0, 0, 1000, 600),  # cold, even with a shared prefix
        _turn(0, 1, 1004, 1100, 1004),  # all of its history: prefills its 96 new tokens
        _turn(1, 1, 1004, 1100, 100),  # a miss: prefills 1,000 for 96 new
        _turn(0, 2, 1104, 1200, 1190),  # more than its history: credited its history
    ]
    run = CrowdRun(Clients.NAMED, None, turns, wall_s=2.0, cache=None)
    assert run.hit_rate == pytest.approx((1004 + 100 + 1104) / (1004 + 1004 + 1104))
    prefilled = (1100 - 1004) + (1100 - 100) + (1200 - 1190)
    assert run.prefill_ratio == pytest.approx(prefilled / (96 + 96 + 96))
    assert run.output_tok_s == pytest.approx(5 * 4 / 2.0)
    warm, cold = run.warm_ttft, run.cold_ttft
    assert (warm.count, cold.count) == (3, 2)
    # warm TTFTs: 0.2, 0.3, 0.4; p95 interpolates between the two highest ranks
    assert (warm.p50, warm.p95) == (pytest.approx(0.3), pytest.approx(0.39))
    assert (cold.p50, cold.p95) == (pytest.approx(0.15), pytest.approx(0.195))


def test_inter_token_latency_pools_every_gap_of_every_answer() -> None:
    turns = [
        CrowdTurn(0, 0, 0, 2.0, 1000, 4, 0, gaps_s=(0.01, 0.02, 0.03)),
        CrowdTurn(1, 0, 0, 2.5, 1000, 3, 0, gaps_s=(0.5, 0.04)),  # a stall behind a prefill
        CrowdTurn(0, 1, 1004, 0.1, 1100, 1, 1004),  # one token: no gap
    ]
    itl = CrowdRun(Clients.NAMED, None, turns, wall_s=3.0, cache=None).inter_token
    # the pooled gaps 0.01, 0.02, 0.03, 0.04, 0.5: p95 sits 0.8 of the way from 0.04 to 0.5
    assert itl.count == 5
    assert (itl.p50, itl.p95) == (pytest.approx(0.03), pytest.approx(0.04 + 0.8 * 0.46))
    assert CrowdRun(Clients.NAMED, None, [turns[2]], 1.0, None).inter_token.p50 is None


def test_the_longest_gap_is_the_worst_wait_inside_any_answer() -> None:
    turns = [
        CrowdTurn(0, 0, 0, 2.0, 1000, 4, 0, gaps_s=(0.01, 0.02, 0.03)),
        CrowdTurn(1, 0, 0, 2.5, 1000, 3, 0, gaps_s=(4.5, 0.04)),  # preempted, then resumed
    ]
    assert CrowdRun(Clients.NAMED, None, turns, 3.0, None).longest_gap_s == 4.5
    assert CrowdRun(Clients.NAMED, None, [], 1.0, None).longest_gap_s is None


class Ticks:
    """The stream reader's clock, one second a reading: it reads it once per SSE event, so a
    gap counts the events between two tokens, whatever the machine's load does to the real
    time between them."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        self.now += 1.0
        return self.now


def test_each_turn_records_the_gaps_between_its_streamed_tokens(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(workload, "time", Ticks())
    spec = dataclasses.replace(SPEC, agents=1)  # one stream at a time reads the clock
    with running(FakeServer()) as fake:
        run = _crowd(fake, Clients.NAMED, spec)
    for turn in run.turns:
        # One delta per token, each read right after the one before it: no other event
        # between them, nor the request's own send or its first (role-only) event.
        assert turn.gaps_s == (1.0,) * (spec.max_tokens - 1)
    assert run.inter_token.count == len(run.turns) * (spec.max_tokens - 1)


def test_ratios_are_none_when_the_server_does_not_report_cached_tokens() -> None:
    turns = [_turn(0, t, 100 * t, 100 * t + 50, None) for t in range(3)]
    run = CrowdRun(Clients.ANONYMOUS, None, turns, wall_s=1.0, cache=None)
    assert run.hit_rate is None and run.prefill_ratio is None
    assert CrowdRun(Clients.NAMED, None, [], 1.0, None).hit_rate is None  # no warm turn ran


def _counters(memory: int, restored: int, reasons: dict[str, int]) -> CacheCounters:
    totals = fresh_totals() | {"hit_tokens_memory": memory, "restored": restored}
    return CacheCounters.of(totals | {"evicted_to_disk": 2 * restored, "miss_reasons": reasons})


def test_cache_counters_over_a_run_are_the_difference_and_drop_reasons_that_did_not_recur() -> None:
    before = _counters(100, 3, {"nothing_cached": 4, "evicted": 1})
    after = _counters(450, 10, {"nothing_cached": 9, "evicted": 1, "other_model": 2})
    over = counters_over(before, after)
    assert over is not None
    assert (over.hit_tokens_memory, over.restored, over.evicted_to_disk) == (350, 7, 14)
    assert over.miss_reasons == {"nothing_cached": 5, "other_model": 2}
    assert over.disk_writes == 14  # evicted to disk + persisted
    assert counters_over(None, after) is None and counters_over(before, None) is None
    with pytest.raises(ValueError):
        CacheCounters.of(fresh_totals() | {"restored": "7"})


def test_the_run_reports_the_servers_counters_over_it_not_since_its_start(
    fake: FakeServer,
) -> None:
    fake.totals |= {"hit_tokens_memory": 5000, "miss_tokens": 700, "restored": 12}
    fake.totals["miss_reasons"] = {"evicted": 3, "nothing_cached": 2}
    run = _crowd(fake, Clients.NAMED)
    assert run.cache is not None
    cached = sum(t.cached_tokens or 0 for t in run.turns)
    assert run.cache.hit_tokens_memory == cached
    assert run.cache.miss_tokens == sum(t.prompt_tokens for t in run.turns) - cached
    assert run.cache.restored == 0
    assert run.cache.miss_reasons == {"nothing_cached": SPEC.agents}  # the cold turns


def test_without_admin_cache_the_servers_columns_say_unknown_and_the_rest_is_measured() -> None:
    with running(FakeServer(admin_cache=False)) as fake:
        run = _crowd(fake, Clients.NAMED)
    assert run.cache is None and run.hit_rate is not None and run.warm_ttft.count == 6
    markdown = to_markdown(_result(CrowdResult(SPEC, [run])))
    assert "| Miss reasons (requests) | unknown |" in markdown
    assert "| Disk blocks read / written | unknown |" in markdown


def test_a_failed_request_is_counted_ends_that_agents_turns_and_the_rest_run_on() -> None:
    notes: list[str] = []
    with running(FakeServer(fail_marker="Agent 1, turn 1:")) as fake:
        run = _crowd(fake, Clients.NAMED, step=notes.append)
        bodies = len(fake.bodies)
    assert len(run.errors) == 1 and run.errors[0].startswith("agent 1 turn 1: HTTP 500")
    assert [t.turn for t in run.turns if t.agent == 1] == [0]
    assert bodies == SPEC.agents * SPEC.turns - 1  # agent 1's turn 2 was never sent
    assert len(notes) == SPEC.agents * SPEC.turns  # the progress bar still reaches its end
    assert "agent 1 turn 2: skipped after an error" in notes
    markdown = to_markdown(_result(CrowdResult(SPEC, [run])))
    assert "| Errors (requests) | 1 |" in markdown
    assert "First error, named: agent 1 turn 1: HTTP 500" in markdown


def test_a_spawned_servers_settings_are_read_as_serve_reads_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The environment counts as it does for the server, and a flag over it.
    monkeypatch.setenv("SEMANTIC_BLOCK_TOKENS", "64")
    assert server_block_tokens([]) == 64
    assert server_block_tokens(["--block-tokens", "32"]) == 32
    with pytest.raises(BenchError, match="server's"):
        server_block_tokens(["--block-tokens", "none"])


def test_the_pool_is_the_final_histories_over_the_factor_unless_a_budget_is_given(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("semantic_bench.pool_phases.kv_bytes_per_token", lambda *_: 23_040)
    tokens = 2000 + 4 * (50 + 64 + 10)  # 2,496: system prompt, then user, answer, template
    for block_tokens, held in ((16, tokens), (256, 2560)):  # a history fills whole blocks
        args = ["--block-tokens", str(block_tokens)]
        options = BenchOptions(crowd_agents=16, crowd_turns=4, system_tokens=2000, server_args=args)
        budget = crowd_budget(options)
        assert budget.needed_mb == pytest.approx(16 * held * 23_040 / 2**20)
        assert budget.needed_mb / budget.budget_mb == pytest.approx(1.5, rel=0.01)
    given = BenchOptions(crowd_agents=16, server_args=["--cache-budget-mb", "512"])
    assert crowd_budget(given).budget_mb == 512
    with pytest.raises(BenchError, match="not a number"):
        crowd_budget(BenchOptions(server_args=["--cache-budget-mb=lots"]))
    # Two agents over a factor of 3: still room for one agent's whole history.
    two = WorkloadSpec(agents=2, turns=2, system_tokens=1000, user_tokens=50, max_tokens=64)
    one_agent_mb = (1000 + 2 * (50 + 64 + 10)) * 1000 / 2**20
    assert pool_budget(two, 1000, share=1 / 3, floor_agents=1).budget_mb >= one_agent_mb


def test_crowd_flags_become_options_and_its_system_prompts_default_to_the_workloads() -> None:
    parser = argparse.ArgumentParser()
    add_bench_arguments(parser)
    argv = ["--phases", "crowd", "--crowd-agents", "4", "--crowd-turns", "2"]
    argv += ["--system-tokens", "2000", "--crowd-clients", "anonymous"]
    argv += ["--crowd-answer-tokens", "32", "--crowd-pool-factor", "2"]
    options = options_from_args(parser.parse_args(argv), argv)
    assert options.phases == (Phase.CROWD,)
    assert options.crowd_clients == (Clients.ANONYMOUS,) and options.crowd_pool_factor == 2.0
    assert options.crowd_spec == WorkloadSpec(
        agents=4, turns=2, system_tokens=2000, user_tokens=50, max_tokens=32
    )
    own = ["--crowd-system-tokens", "300", "--crowd-clients", "both"]
    options = options_from_args(parser.parse_args(own), own)
    assert options.crowd_spec.system_tokens == 300
    assert options.crowd_clients == (Clients.ANONYMOUS, Clients.NAMED)  # anonymous first
    for bad in (["--crowd-turns", "1"], ["--crowd-pool-factor", "0"], ["--crowd-clients", "x"]):
        with pytest.raises(SystemExit):
            parser.parse_args(bad)
    with pytest.raises(BenchError, match="crowd"):
        BenchOptions(crowd_clients=())


def test_run_bench_runs_the_crowd_once_per_kind_of_client_and_reports_both(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with running(FakeServer()) as fake:
        options = BenchOptions(
            base_url=fake.url + "/v1",
            system_tokens=30,
            user_tokens=8,
            baseline=False,
            phases=(Phase.CROWD,),
            crowd_agents=2,
            crowd_turns=2,
            crowd_answer_tokens=3,
            json_out=tmp_path / "bench.json",
            markdown_out=tmp_path / "bench.md",
        )
        result = run_bench(options)
        named = [b for b in fake.bodies if "crowd-named" in b["messages"][0]["content"]]
    assert result.crowd is not None
    assert [run.clients for run in result.crowd.runs] == [Clients.ANONYMOUS, Clients.NAMED]
    assert len(named) == 4 and all("session_id" in b for b in named)
    progress = capsys.readouterr().err
    assert "phase 3/3: crowd, named clients: 2 agents at once × 2 turns" in progress
    markdown = (tmp_path / "bench.md").read_text()
    assert "| Metric | anonymous (no session id) | named (session_id) |" in markdown
    assert "| KV pool | the server's own | the server's own |" in markdown
    data = json.loads((tmp_path / "bench.json").read_text())
    assert set(data["cache"]["crowd"]) == {"named", "anonymous"}
    assert data["cache"]["crowd"]["named"]["errors"] == 0


def _result(crowd: CrowdResult) -> BenchResult:
    return bench_result("semantic bench --phases crowd --no-baseline", (Phase.CROWD,), crowd=crowd)


def test_the_crowd_section_puts_each_kind_of_client_in_a_column() -> None:
    turns = [_turn(0, 0, 0, 1000, 0), _turn(0, 1, 1004, 1100, 1004)]
    turns[1] = CrowdTurn(0, 1, 1004, 0.4, 1100, 4, 1004, gaps_s=(0.02, 0.03, 0.25))
    cache = _counters(1004, 5, {"nothing_cached": 1, "evicted": 1})
    named = CrowdRun(Clients.NAMED, PoolBudget(900.0, 600), turns, 10.0, cache)
    anonymous = CrowdRun(Clients.ANONYMOUS, PoolBudget(900.0, 600), turns, 8.0, None)
    data = json.loads(json.dumps(to_json(_result(CrowdResult(SPEC, [named, anonymous])))))
    markdown = to_markdown(_result(CrowdResult(SPEC, [named, anonymous])))
    assert "#### Crowd: 3 agents at once × 3 turns, ~30-token system prompts" in markdown
    assert "| KV pool | 600 MiB for 900 MiB of histories | 600 MiB for 900 MiB" in markdown
    assert "| Warm hit rate (Σ cached ÷ Σ history) | 100.0% | 100.0% |" in markdown
    assert "| Warm turns: prefilled ÷ new tokens | 1.00× | 1.00× |" in markdown
    assert "| Miss reasons (requests) | evicted 1, nothing_cached 1 | unknown |" in markdown
    assert "| Disk blocks read / written | 5 / 10 | unknown |" in markdown
    assert "| Prompt tokens from memory / disk / prefilled | 1,004 / 0 / 0 | unknown |" in markdown
    assert "| Aggregate output (tok/s) | 0.8 | 1.0 |" in markdown
    assert "| Inter-token latency p50 / p95 (s) | 0.030 / 0.228 | 0.030 / 0.228 |" in markdown
    assert "| Longest gap in an answer (s) | 0.250 | 0.250 |" in markdown
    assert data["cache"]["crowd"]["named"]["longest_gap_s"] == pytest.approx(0.25)
    assert data["cache"]["crowd"]["named"]["inter_token_p95_s"] == pytest.approx(0.228)
    assert data["cache"]["crowd"]["named"]["prefilled_over_new"] == pytest.approx(1.0)
    assert data["result"]["crowd"]["runs"][0]["cache"]["restored"] == 5


@pytest.mark.skipif(
    importlib.util.find_spec("mlx") is None,
    reason="needs MLX (Apple Silicon, or `pip install 'mlx[cpu]'` on Linux)",
)
def test_the_pool_phases_size_an_mlx_servers_pool_by_the_mlx_backends_numerics() -> None:
    # SmolLM2: 2 · 30 layers · 3 KV heads · 64 values, in fp32 (MLX's CPU default) or 8 bits
    mlx_cpu = ["--backend", "mlx", "--device", "cpu"]
    assert kv_bytes_per_token("smollm2-135m", mlx_cpu) == 2 * 30 * 3 * 64 * 4
    assert kv_bytes_per_token("smollm2-135m", [*mlx_cpu, "--dtype", "bfloat16"]) == 23_040
    assert kv_bytes_per_token("smollm2-135m", [*mlx_cpu, "--kv-dtype", "int8"]) == 11_880
