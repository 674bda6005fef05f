"""The bench's charts, drawn from a run's results as SVG and written beside its Markdown: cold
and warm time to first token by history length, tokens a second by number of agents, and the
crowd's warm hit rate and time to first token over the run."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from semantic_bench.crowd import CrowdResult, CrowdRun, CrowdTurn
from semantic_bench.history import HistoryResult
from semantic_bench.svg import Axis, Series, chart_svg, round_ticks

if TYPE_CHECKING:
    from semantic_bench.report import BenchResult

DECODE = "decode, one stream per agent"
OUTPUT = "output of the workload's turns"


@dataclass(slots=True, frozen=True)
class Chart:
    """One chart of a run: its file is `<the Markdown's stem>-<slug>.svg`, its title the
    image's alt text; `note` is a line for the Markdown under it, when the chart needs one."""

    slug: str
    title: str
    svg: str
    note: str | None = None


def of_run(result: BenchResult) -> list[Chart]:
    """Every chart the run has data for, in the order the Markdown shows them."""
    date = result.started_at[:10]
    found: list[Chart] = []
    if result.history is not None and result.history.points:
        title = f"Cold and warm time to first token by history, {date}"
        svg = ttft_by_history_svg(history_points(result.history), title)
        found.append(Chart("ttft-by-history", title, svg))
    if points := throughput_points(result):
        found.append(tok_s_by_agents(points, f"Tokens a second by number of agents, {date}"))
    if result.crowd is not None and any(run.turns for run in result.crowd.runs):
        found += crowd_over_time(result.crowd, date)
    return found


@dataclass(slots=True, frozen=True)
class HistoryTTFT:
    """One history length: the median time to first token of its cold and warm turns."""

    tokens: int
    cold_s: float
    warm_s: float


def history_points(history: HistoryResult) -> list[HistoryTTFT]:
    return [
        HistoryTTFT(p.history_tokens, p.cold_ttft_s, p.warm_ttft_s)
        for p in sorted(history.points, key=lambda p: p.history_tokens)
    ]


def ttft_by_history_svg(points: Sequence[HistoryTTFT], title: str) -> str:
    """Two lines over history length, cold and warm, each point labelled with its seconds."""
    top_s = max(p.cold_s for p in points) * 1.15 or 1.0
    x_axis = Axis(
        "history (tokens)",
        max(p.tokens for p in points) * 1.05,
        tuple((p.tokens, f"{p.tokens:,}") for p in points),
    )
    y_axis = Axis("time to first token (s)", top_s, round_ticks(top_s))
    series = [
        Series("cold turns", tuple((p.tokens, p.cold_s) for p in points), label=_seconds),
        Series("warm turns", tuple((p.tokens, p.warm_s) for p in points), label=_seconds),
    ]
    return chart_svg(title, series, x_axis, y_axis)


@dataclass(slots=True, frozen=True)
class AgentsTokS:
    """Tokens a second with `agents` agents at once, by one way of measuring them (`measure`,
    the series it is drawn in)."""

    measure: str
    agents: int
    tok_s: float


def throughput_points(result: BenchResult) -> list[AgentsTokS]:
    """What the run measured at each number of agents: decode with one stream and with one per
    agent at once; the workload's output; each crowd run's output."""
    points = []
    if result.decode is not None:
        points.append(AgentsTokS(DECODE, 1, result.decode.tok_s))
    if result.concurrent is not None:
        points.append(AgentsTokS(DECODE, result.concurrent.streams, result.concurrent.tok_s))
    if result.workload is not None:
        points.append(AgentsTokS(OUTPUT, result.spec.agents, result.workload.output_tok_s))
    if result.crowd is not None:
        crowd = result.crowd
        points += [
            AgentsTokS(
                f"output of the crowd, {run.clients} clients", crowd.spec.agents, run.output_tok_s
            )
            for run in crowd.runs
        ]
    return points


def tok_s_by_agents(points: Sequence[AgentsTokS], title: str) -> Chart:
    """A line per way of measuring, over the number of agents, each point labelled. A run that
    measured one number of agents gets its points in one column, and a note that says so."""
    agents = sorted({p.agents for p in points})
    top = max(p.tok_s for p in points) * 1.15 or 1.0
    x_axis = Axis("agents at once", max(agents) * 1.1 + 1, tuple((a, str(a)) for a in agents))
    y_axis = Axis("tokens a second", top, round_ticks(top))
    measures = list(dict.fromkeys(p.measure for p in points))  # in the order first measured
    series = [
        Series(m, tuple((p.agents, p.tok_s) for p in points if p.measure == m), label=_tok_s)
        for m in measures
    ]
    note = None
    if len(agents) == 1:
        note = f"This run measured one number of agents ({agents[0]}): the chart has one column."
    return Chart("tok-s-by-agents", title, chart_svg(title, series, x_axis, y_axis), note)


def crowd_over_time(crowd: CrowdResult, date: str) -> list[Chart]:
    """Each turn's time to first token, and each warm turn's share of its history read from
    the cache, at the time it was sent: a point per turn, a series per kind of client, on one
    time axis. No hit rate chart when the server does not report cached tokens."""
    runs = [run for run in crowd.runs if run.turns]
    end = max(t.sent_s + t.ttft_s for run in runs for t in run.turns) * 1.05 or 1.0
    time_axis = Axis("seconds into the run", end, round_ticks(end))
    charts = [_crowd_ttft(runs, time_axis, date)]
    hits = [Series(f"{run.clients} clients", _hit_points(run.turns), False) for run in runs]
    if any(series.points for series in hits):
        # Room above 100% for the legend: the warm turns' points mostly sit at the top.
        y_axis = Axis("warm turn's history from the cache (%)", 125.0, round_ticks(100.0))
        title = f"The crowd's warm hit rate over the run, {date}"
        svg = chart_svg(title, hits, time_axis, y_axis)
        charts.append(Chart("crowd-hit-rate-over-time", title, svg))
    return charts


def _crowd_ttft(runs: Sequence[CrowdRun], time_axis: Axis, date: str) -> Chart:
    ttft = [
        Series(f"{run.clients} clients", tuple((t.sent_s, t.ttft_s) for t in run.turns), False)
        for run in runs
    ]
    top_s = max(t.ttft_s for run in runs for t in run.turns) * 1.15 or 1.0
    y_axis = Axis("time to first token (s)", top_s, round_ticks(top_s))
    title = f"The crowd's time to first token over the run, {date}"
    return Chart("crowd-ttft-over-time", title, chart_svg(title, ttft, time_axis, y_axis))


def _hit_points(turns: Sequence[CrowdTurn]) -> tuple[tuple[float, float], ...]:
    """(sent, % of its history cached) for each warm turn whose server said what it cached."""
    return tuple(
        (t.sent_s, 100 * min(t.cached_tokens, t.history_tokens) / t.history_tokens)
        for t in turns
        if t.warm and t.cached_tokens is not None and t.history_tokens > 0
    )


def _seconds(value: float) -> str:
    return f"{value:.3f} s"


def _tok_s(value: float) -> str:
    return f"{value:.1f}"
