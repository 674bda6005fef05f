"""The bench's charts: SVGs of cold and warm time to first token by history length, of tokens a
second by number of agents, and of the crowd's hit rate and TTFT over the run, written beside
the run's Markdown; and the committed charts in the docs, drawn by the same code."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

from semantic_bench.charts import (
    DECODE,
    OUTPUT,
    AgentsTokS,
    crowd_over_time,
    tok_s_by_agents,
    ttft_by_history_svg,
)
from semantic_bench.crowd import CrowdResult, CrowdRun, CrowdTurn
from semantic_bench.options import Clients, Phase
from semantic_bench.plan import WorkloadSpec
from semantic_bench.report import write_markdown
from semantic_bench.svg import round_ticks
from semantic_bench.workload import ConcurrentDecodeResult, DecodeResult
from tests.benchmark_script import load_benchmark
from tests.unit.bench_records import bench_result

DOCS = Path(__file__).parents[2] / "docs"
SVG = "{http://www.w3.org/2000/svg}"
committed_charts = load_benchmark("committed_charts")


def series(svg: str) -> dict[str, int]:
    """Each series' name and its number of points, read back from the SVG as XML."""
    root = ET.fromstring(svg)
    assert root.tag == f"{SVG}svg"
    groups = [g for g in root.iter(f"{SVG}g") if g.get("class") == "series"]
    return {str(g.get("data-series")): len(g.findall(f"{SVG}circle")) for g in groups}


def test_the_history_chart_has_both_lines_and_every_value() -> None:
    points = committed_charts.FULL_RUN_HISTORY
    svg = ttft_by_history_svg(points, "title")
    assert series(svg) == {"cold turns": 3, "warm turns": 3}
    texts = [text.text for text in ET.fromstring(svg).iter(f"{SVG}text")]
    for point in points:
        assert f"{point.cold_s:.3f} s" in texts and f"{point.warm_s:.3f} s" in texts
        assert f"{point.tokens:,}" in texts


def test_the_agents_chart_draws_a_line_per_measure_over_the_numbers_of_agents() -> None:
    points = [AgentsTokS(DECODE, 1, 75.0), AgentsTokS(DECODE, 8, 340.2)]
    points += [AgentsTokS(OUTPUT, 8, 103.1), AgentsTokS("crowd", 16, 70.0)]
    chart = tok_s_by_agents(points, "title")
    assert series(chart.svg) == {DECODE: 2, OUTPUT: 1, "crowd": 1}
    assert len(ET.fromstring(chart.svg).findall(f"{SVG}g/{SVG}polyline")) == 1  # decode's
    assert chart.note is None


def test_a_run_with_one_number_of_agents_says_its_chart_has_one_column() -> None:
    chart = tok_s_by_agents([AgentsTokS(OUTPUT, 4, 50.0)], "title")
    assert series(chart.svg) == {OUTPUT: 1}
    assert chart.note is not None and "one number of agents (4)" in chart.note


def _crowd_run(clients: Clients, cached: int | None) -> CrowdRun:
    """Two agents of three turns, sent one second apart; each warm turn reports `cached`."""
    turns = [
        CrowdTurn(
            agent,
            turn,
            1000 * turn,
            0.5,
            1000 * turn + 100,
            4,
            cached if turn else 0,
            sent_s=turn + agent / 2,
        )
        for agent in range(2)
        for turn in range(3)
    ]
    return CrowdRun(clients, None, turns, wall_s=4.0, cache=None)


def test_the_crowds_charts_have_a_point_per_turn_and_per_warm_turn() -> None:
    runs = [_crowd_run(Clients.ANONYMOUS, 900), _crowd_run(Clients.NAMED, 1000)]
    ttft, hits = crowd_over_time(CrowdResult(WorkloadSpec(2, 3, 1000, 50, 4), runs), "today")
    assert series(ttft.svg) == {"anonymous clients": 6, "named clients": 6}
    assert series(hits.svg) == {"anonymous clients": 4, "named clients": 4}  # warm turns only


def test_no_hit_rate_chart_when_the_server_does_not_say_what_it_cached() -> None:
    crowd = CrowdResult(WorkloadSpec(2, 3, 1000, 50, 4), [_crowd_run(Clients.NAMED, None)])
    assert [chart.slug for chart in crowd_over_time(crowd, "today")] == ["crowd-ttft-over-time"]


def test_the_markdown_file_shows_every_chart_written_beside_it(tmp_path: Path) -> None:
    result = bench_result(
        "semantic bench --phases decode,crowd",
        (Phase.DECODE, Phase.CROWD),
        decode=DecodeResult(65, 0.8),
        concurrent=ConcurrentDecodeResult(8, 8 * 65, 2.0),
        crowd=CrowdResult(WorkloadSpec(2, 3, 1000, 50, 4), [_crowd_run(Clients.NAMED, 900)]),
    )
    write_markdown(result, tmp_path / "run.md")
    markdown = (tmp_path / "run.md").read_text()
    for slug in ("tok-s-by-agents", "crowd-ttft-over-time", "crowd-hit-rate-over-time"):
        ET.parse(tmp_path / f"run-{slug}.svg")
        assert f"](run-{slug}.svg)" in markdown


def test_the_docs_show_the_committed_charts_as_the_code_draws_them() -> None:
    page = (DOCS / "benchmarks.md").read_text()
    for name, svg in committed_charts.committed().items():
        assert (DOCS / "figures" / name).read_text() == svg
        assert f"figures/{name}" in page


def test_the_ticks_fall_on_round_steps_up_to_the_axis_top() -> None:
    assert [text for _, text in round_ticks(391.2)] == ["0", "100", "200", "300"]
    assert [text for _, text in round_ticks(6.2)] == ["0", "2", "4", "6"]
    assert [text for _, text in round_ticks(0.57)] == ["0.0", "0.2", "0.4"]
