"""The bench's cache phases against the fake SSE server: honest cold twins (same length, no
reusable prefix), history and restart figures, pressure hit-rate arithmetic, the restart phase
skipped against --base-url, and the report's ratios and command line."""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import TypeVar

import httpx
import pytest

from semantic_bench.cache_counters import AgentKV, read_agent_kv
from semantic_bench.cli import add_bench_arguments, options_from_args
from semantic_bench.conversation import (
    ANSWER_TOKENS,
    WARM_MARKER,
    Chat,
    Probe,
    cold_marker,
    cold_markers,
)
from semantic_bench.errors import BenchError
from semantic_bench.history import HistoryPoint, HistoryResult, run_history
from semantic_bench.machine import Machine, _cpu_model
from semantic_bench.options import BenchOptions, Phase
from semantic_bench.plan import BenchPlan, WorkloadSpec, build_plan
from semantic_bench.pressure import (
    PoolBudget,
    PressureResult,
    PressureTurn,
    pool_budget,
    run_pressure,
)
from semantic_bench.report import BenchResult, to_json, to_markdown, write_markdown
from semantic_bench.restart import RestartResult, RestartTurn, run_restart
from semantic_bench.run import run_bench
from semantic_bench.server import RestartTiming
from tests.unit.bench_records import bench_result
from tests.unit.test_bench_fakeserver import (
    COLD_DELAY_S,
    TOKENS_PER_WORD,
    FakeServer,
    common_prefix,
    prompt_words,
    running,
)

TIMING = RestartTiming(stop_s=1.5, ready_s=4.0, exit_code=0)
T = TypeVar("T")


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeServer]:
    with running(FakeServer()) as server:
        yield server


def _plan(tag: str) -> BenchPlan:
    spec = WorkloadSpec(agents=1, turns=1, system_tokens=40, user_tokens=12, max_tokens=3)
    return build_plan(spec, TOKENS_PER_WORD, tag)


def _with_chat(fake: FakeServer, tag: str, work: Callable[[Chat], Awaitable[T]]) -> T:
    """Run `work(chat)` in a fresh event loop, against the fake, on a plan tagged `tag`."""

    async def main() -> T:
        async with httpx.AsyncClient(base_url=fake.url, timeout=10) as client:
            return await work(Chat(client, "m", _plan(tag)))

    return asyncio.run(main())


def _quiet(note: str) -> None:
    pass


def _history(fake: FakeServer, tag: str, sizes: tuple[int, ...], repeats: int) -> HistoryResult:
    return _with_chat(fake, tag, lambda c: run_history(c, sizes, repeats, cold_markers(), _quiet))


def test_cold_twins_have_the_warm_prompts_length_but_share_no_prefix_with_anything_sent(
    fake: FakeServer,
) -> None:
    before = len(fake.bodies)
    result = _history(fake, "twins", (300, 150), repeats=2)
    assert [p.target_tokens for p in result.points] == [150, 300]  # smallest first
    bodies = fake.bodies[before:]
    colds = [b for b in bodies if "-cold-" in b["session_id"]]
    assert len(colds) == 4
    for cold in colds:
        earlier = bodies[: bodies.index(cold)]
        words = prompt_words(cold["messages"])
        assert all(common_prefix(words, prompt_words(b["messages"])) == 0 for b in earlier)
        warm = earlier[-1]  # the warm probe of the same repeat, sent just before
        assert cold["messages"][1:] == warm["messages"][1:]
        assert cold["messages"][0]["content"][1:] == warm["messages"][0]["content"][1:]
    for point in result.points:
        assert [c.prompt_tokens for c in point.cold] == [w.prompt_tokens for w in point.warm]
        assert point.token_mismatch == 0.0
        assert all(c.cached_tokens == 0 for c in point.cold)
        assert point.cold_cached_share == 0.0
        assert point.warm_cached_share is not None and point.warm_cached_share > 0.8


def test_histories_are_grown_to_their_size_as_the_server_counts_it(fake: FakeServer) -> None:
    result = _history(fake, "sizes", (400,), repeats=1)
    (point,) = result.points
    assert abs(point.history_tokens - 400) <= 20
    assert point.cold_ttft_s >= COLD_DELAY_S
    assert point.speedup == pytest.approx(point.cold_ttft_s / point.warm_ttft_s)
    assert result.flatness is None  # one size: nothing to compare


def test_cold_markers_are_distinct_and_never_the_warm_marker_or_r() -> None:
    markers = [cold_marker(i) for i in range(200)]
    assert len(set(markers)) == 200
    assert not any(m[0] in (WARM_MARKER, "R") for m in markers)
    assert markers[:3] == ["B", "C", "D"]


def _probe(ttft: float, prompt: int, cached: int) -> Probe:
    return Probe(ttft, prompt, cached)


def test_history_figures_are_medians_ratios_and_flatness() -> None:
    warm = [_probe(t, 1050, 990) for t in (0.1, 0.3, 0.2)]
    small = HistoryPoint(1000, 1000, warm, [_probe(t, 1050, 3) for t in (1.0, 3.0, 2.0)])
    warm = [_probe(0.3, 4060, 4000)] * 3
    large = HistoryPoint(4000, 4010, warm, [_probe(t, 4061, 3) for t in (8.0, 9.0, 10.0)])
    result = HistoryResult(3, [large, small])
    assert (small.cold_ttft_s, small.warm_ttft_s, small.speedup) == (2.0, 0.2, pytest.approx(10))
    assert small.warm_cached_share == pytest.approx(990 / 1050)
    assert large.token_mismatch == pytest.approx(1 / 4060)
    assert result.flatness == pytest.approx(1.5)  # warm@4000 ÷ warm@1000
    assert result.at(4000) is large and result.at(2000) is None


def test_restart_phase_restarts_once_and_reads_each_agents_history_back(fake: FakeServer) -> None:
    restarts: list[int] = []

    def restart() -> RestartTiming:
        restarts.append(1)
        return TIMING

    result = _with_chat(
        fake, "restart", lambda c: run_restart(c, 200, 2, restart, None, cold_markers(), _quiet)
    )
    assert restarts == [1] and result.timing == TIMING
    assert [t.agent for t in result.turns] == [0, 1]
    for turn in result.turns:  # the fake forgets nothing, but caches prompts, not answers
        assert turn.history_share is not None and turn.history_share > 0.9
    assert result.cold_measured_here and result.cold_ttft_s is not None
    assert result.ratio_to_cold is not None and result.ratio_to_cold < 0.5


def _turn(agent: int, turn: int, history: int, prompt: int, cached: int) -> PressureTurn:
    return PressureTurn(agent, turn, history, 0.1 * (turn + 1), prompt, cached)


def test_pressure_hit_rate_is_cached_over_prompt_tokens_of_warm_turns_only() -> None:
    turns = [
        _turn(0, 0, 0, 1000, 0),  # cold: left out of the hit rate
        _turn(1, 0, 0, 1000, 500),  # cold, even with a shared prefix
        _turn(0, 1, 1016, 1100, 1016),  # a hit
        _turn(1, 1, 1016, 1100, 300),  # a miss: under half its history
        _turn(0, 2, 1116, 1200, 600),  # just over half: not a miss
    ]
    result = PressureResult(2, 3, PoolBudget(300.0, 120), turns)
    assert result.hit_rate == pytest.approx((1016 + 300 + 600) / (1100 + 1100 + 1200))
    assert result.misses == 1 and len(result.warm_turns) == 3
    assert result.warm_ttft.count == 3 and result.cold_ttft.count == 2


def test_pressure_hit_rate_is_none_when_the_server_never_reports_cached_tokens() -> None:
    turns = [PressureTurn(0, t, 100 * t, 0.1, 1000, None) for t in range(3)]
    assert PressureResult(1, 3, None, turns).hit_rate is None


def test_pressure_spec_keeps_the_workloads_prompts_with_short_answers() -> None:
    options = BenchOptions(system_tokens=500, user_tokens=20, seed=7, pressure_agents=5)
    assert options.pressure_spec == WorkloadSpec(
        agents=5, turns=3, system_tokens=500, user_tokens=20, max_tokens=ANSWER_TOKENS, seed=7
    )


def test_pool_budget_holds_well_under_all_agents() -> None:
    spec = WorkloadSpec(agents=12, turns=3, system_tokens=1000, user_tokens=50, max_tokens=16)
    budget = pool_budget(spec, bytes_per_token=23_040)  # SmolLM2-135M in bf16
    per_agent = (1000 + 3 * (50 + 16 + 10)) * 23_040
    assert budget.needed_mb == pytest.approx(12 * per_agent / 2**20)
    assert 0.35 * budget.needed_mb < budget.budget_mb < 0.45 * budget.needed_mb
    few = WorkloadSpec(agents=2, turns=3, system_tokens=1000, user_tokens=50, max_tokens=16)
    assert pool_budget(few, 23_040).budget_mb >= 3 * per_agent / 2**20  # room to run


def test_pressure_runs_agents_round_robin_and_reports_warm_turns(fake: FakeServer) -> None:
    spec = WorkloadSpec(agents=3, turns=2, system_tokens=30, user_tokens=8, max_tokens=2)
    before = len(fake.bodies)
    result = _with_chat(fake, "press", lambda c: run_pressure(c, spec, None, _quiet))
    order = [b["session_id"][-1] for b in fake.bodies[before:]]
    assert order == ["0", "1", "2", "0", "1", "2"]
    assert result.misses == 0 and result.hit_rate is not None and result.hit_rate > 0.7
    assert all(t.history_tokens > 0 for t in result.warm_turns)


def test_restart_is_skipped_with_a_note_against_a_base_url(
    fake: FakeServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    options = BenchOptions(
        base_url=fake.url,
        system_tokens=30,
        user_tokens=8,
        baseline=False,
        phases=(Phase.HISTORY, Phase.RESTART),
        history_sizes=(120,),
        repeats=1,
        markdown_out=tmp_path / "bench.md",
    )
    assert options.runnable_phases() == (Phase.HISTORY,)
    result = run_bench(options)
    assert result.restart is None and result.history is not None
    assert "restart phase skipped" in capsys.readouterr().err
    assert "restart phase skipped" in (tmp_path / "bench.md").read_text()


def _result() -> BenchResult:
    small = HistoryPoint(1000, 1003, [_probe(0.2, 1060, 1000)] * 3, [_probe(1.6, 1060, 3)] * 3)
    large = HistoryPoint(4000, 3998, [_probe(0.25, 4050, 3990)] * 3, [_probe(7.5, 4051, 3)] * 3)
    after = [RestartTurn(0, 3998, _probe(0.5, 4050, 3900))]
    turns = [_turn(0, 0, 0, 1000, 0), _turn(0, 1, 1016, 1100, 1016)]
    return bench_result(
        "semantic bench --phases history,restart,pressure --no-baseline",
        (Phase.HISTORY, Phase.RESTART, Phase.PRESSURE),
        history=HistoryResult(3, [small, large]),
        restart=RestartResult(4000, TIMING, after, cold_ttft_s=7.5, cold_measured_here=False),
        pressure=PressureResult(12, 3, PoolBudget(330.0, 132), turns),
    )


def test_markdown_carries_the_cache_ratios_the_command_line_and_the_machine() -> None:
    markdown = to_markdown(_result())
    assert "semantic bench --phases history,restart,pressure --no-baseline" in markdown
    assert "AMD EPYC, 2 cores, Linux x86_64, torch 2.13.0+cpu" in markdown
    assert "| 1,003 | 1,060 | 1.600 | 0.200 | 8.00× | 94.3% | 0.3% |" in markdown
    assert "| 3,998 | 4,050 | 7.500 | 0.250 | 30.00× |" in markdown
    assert "warm TTFT at 4,000 ÷ at 1,000 tokens = 1.25×" in markdown
    assert "| 0 | 3,998 | 3,900 | 97.5% | 0.500 | 0.07× |" in markdown
    assert "| Warm-turn hit rate (Σ cached ÷ Σ prompt) | 92.4% |" in markdown
    assert "| Misses (warm turns) | 0 of 1 |" in markdown
    assert "132 MiB for 330 MiB of histories" in markdown
    assert "Single-stream decode" not in markdown  # a phase not run has no row


def test_the_markdown_file_shows_the_history_chart_written_beside_it(tmp_path: Path) -> None:
    write_markdown(_result(), tmp_path / "run.md")
    chart = tmp_path / "run-ttft-by-history.svg"
    assert "1.600 s" in chart.read_text() and "0.250 s" in chart.read_text()
    assert "](run-ttft-by-history.svg)" in (tmp_path / "run.md").read_text()


def test_json_carries_the_derived_cache_figures() -> None:
    data = json.loads(json.dumps(to_json(_result())))
    assert data["cache"]["history"]["flatness"] == pytest.approx(1.25)
    assert data["cache"]["history"]["points"][0]["cold_over_warm"] == pytest.approx(8.0)
    assert data["cache"]["restart"]["ratio_to_cold"] == pytest.approx(0.5 / 7.5)
    assert data["cache"]["pressure"]["hit_rate"] == pytest.approx(1016 / 1100)
    assert data["result"]["command"].startswith("semantic bench")


def test_cache_flags_become_options_and_the_command_line_is_kept() -> None:
    parser = argparse.ArgumentParser()
    add_bench_arguments(parser)
    argv = ["--phases", "restart,history", "--history-sizes", "2000,1000", "--repeats", "1"]
    options = options_from_args(parser.parse_args(argv), argv)
    assert options.phases == (Phase.HISTORY, Phase.RESTART)  # run order, not flag order
    assert (options.history_sizes, options.repeats) == ((1000, 2000), 1)
    assert options.command == "semantic " + " ".join(argv)
    assert options_from_args(parser.parse_args([]), []).phases == tuple(Phase)
    with pytest.raises(SystemExit):
        parser.parse_args(["--phases", "history,warp"])
    with pytest.raises(BenchError, match="cache-dir"):
        BenchOptions(base_url="http://x", cache_dir=Path("c"))


def test_the_parser_rejects_fewer_than_two_pressure_turns() -> None:
    parser = argparse.ArgumentParser()
    add_bench_arguments(parser)
    assert parser.parse_args(["--pressure-turns", "2"]).pressure_turns == 2
    with pytest.raises(SystemExit):
        parser.parse_args(["--pressure-turns", "1"])


def test_machine_names_the_cpu_model_from_proc_cpuinfo(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: AMD EPYC 9654 96-Core Processor\n")
    assert _cpu_model(cpuinfo) == "AMD EPYC 9654 96-Core Processor"
    assert Machine.this().cores >= 1


def test_the_history_phase_reports_the_kv_the_server_holds_against_full_attention() -> None:
    agents = [{"agent_id": "bench-x-history-4000", "bytes_in_memory": 3 << 20}]
    agents[0]["bytes_full_attention"] = 12 << 20

    def admin(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/admin/cache"
        return httpx.Response(200, json={"totals": {}, "agents": agents})

    async def read(agent_id: str) -> AgentKV | None:
        transport = httpx.MockTransport(admin)
        async with httpx.AsyncClient(transport=transport, base_url="http://x") as client:
            return await read_agent_kv(client, agent_id)

    kv = asyncio.run(read("bench-x-history-4000"))
    assert kv == AgentKV(3 << 20, 12 << 20) and kv.share == 0.25
    assert asyncio.run(read("someone-else")) is None
    result = _result()
    assert result.history is not None
    result.history.points[1].kv = kv
    markdown = to_markdown(result)
    assert "| KV held (MiB) | KV ÷ full attention |" in markdown
    assert "| 3.0 | 25.0% |" in markdown and "| unknown | unknown |" in markdown
