"""The record of one bench run and its three renderings: a rich table for the terminal, JSON for
machines, and a Markdown section for docs/benchmark-history.md. Every figure sits beside its
ratio to the `transformers` baseline, so no number is read without its reference; the cache
phases, which the baseline cannot run, carry their own ratios (`cache_report.py`)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from rich.console import Console
from rich.table import Table

from semantic_bench import cache_report, charts
from semantic_bench.baseline import BaselineResult
from semantic_bench.crowd import CrowdResult
from semantic_bench.history import HistoryResult
from semantic_bench.machine import Machine
from semantic_bench.options import BASELINE_PHASES, Phase
from semantic_bench.plan import WorkloadSpec
from semantic_bench.pressure import PressureResult
from semantic_bench.restart import RestartResult
from semantic_bench.workload import (
    ConcurrentDecodeResult,
    DecodeResult,
    PrefillResult,
    WorkloadResult,
)

BASELINE_LABEL = "transformers generate()"


@dataclass(slots=True)
class BenchResult:
    """Everything one run measured; None for a phase it did not run. `target` names the server
    measured ("semantic" when the bench spawned it, else its base URL); `peak_rss_bytes` is None
    where it can't be read. `command` is the command line that produced it; `notes` say which
    asked-for phases were skipped and why."""

    target: str
    model: str
    spec: WorkloadSpec
    tokens_per_word: float
    machine: Machine
    started_at: str  # ISO 8601, local time
    command: str
    phases: tuple[Phase, ...]
    decode: DecodeResult | None
    prefill: PrefillResult | None
    workload: WorkloadResult | None
    peak_rss_bytes: int | None
    baseline: BaselineResult | None
    concurrent: ConcurrentDecodeResult | None = None
    history: HistoryResult | None = None
    restart: RestartResult | None = None
    pressure: PressureResult | None = None
    crowd: CrowdResult | None = None
    notes: list[str] = field(default_factory=list)


class _Measured(Protocol):
    """What both a `BenchResult` and a `BaselineResult` carry, so one getter reads either."""

    @property
    def decode(self) -> DecodeResult | None: ...
    @property
    def concurrent(self) -> ConcurrentDecodeResult | None: ...
    @property
    def prefill(self) -> PrefillResult | None: ...
    @property
    def workload(self) -> WorkloadResult | None: ...
    @property
    def peak_rss_bytes(self) -> int | None: ...


@dataclass(slots=True, frozen=True)
class Figure:
    """One row of the report: our value, the baseline's, and which direction is better."""

    name: str
    unit: str
    value: float | None
    baseline: float | None
    higher_is_better: bool

    @property
    def ratio(self) -> float | None:
        """Ours ÷ baseline; None when either is missing or the baseline is zero."""
        if self.value is None or not self.baseline:
            return None
        return self.value / self.baseline

    @property
    def label(self) -> str:
        return f"{self.name} ({self.unit}) {'↑' if self.higher_is_better else '↓'}"


Reader = Callable[[_Measured], float | None]


def _decode(read: Callable[[DecodeResult], float | None]) -> Reader:
    return lambda m: read(m.decode) if m.decode else None


def _prefill(read: Callable[[PrefillResult], float | None]) -> Reader:
    return lambda m: read(m.prefill) if m.prefill else None


def _workload(read: Callable[[WorkloadResult], float | None]) -> Reader:
    return lambda m: read(m.workload) if m.workload else None


def _concurrent(m: _Measured) -> float | None:
    return m.concurrent.tok_s if m.concurrent else None


def _concurrent_per_single_stream(m: _Measured) -> float | None:
    if not (m.concurrent and m.decode and m.decode.tok_s):
        return None
    return m.concurrent.tok_s / m.decode.tok_s


def _per_single_stream(m: _Measured) -> float | None:
    if not (m.workload and m.decode and m.decode.tok_s):
        return None
    return m.workload.output_tok_s / m.decode.tok_s


def _mib(m: _Measured) -> float | None:
    return m.peak_rss_bytes / 2**20 if m.peak_rss_bytes is not None else None


def _hit_percent(w: WorkloadResult) -> float | None:
    rate = w.cache_hit_rate
    return rate * 100 if rate is not None else None


@dataclass(slots=True, frozen=True)
class _Row:
    name: str
    unit: str
    higher_is_better: bool
    phase: Phase | None  # the phase that measures it; None: every run
    read: Reader


_ROWS = (
    _Row("Single-stream decode", "tok/s", True, Phase.DECODE, _decode(lambda d: d.tok_s)),
    _Row("Decode, one stream per agent at once (aggregate)", "tok/s", True, Phase.CONCURRENT,
         _concurrent),
    _Row("Concurrent decode ÷ single-stream", "×", True, Phase.CONCURRENT,
         _concurrent_per_single_stream),
    _Row("Prefill, one fresh ~1k-token prompt", "tok/s", True, Phase.PREFILL,
         _prefill(lambda p: p.tok_s)),
    _Row("TTFT cold p50", "s", False, Phase.WORKLOAD, _workload(lambda w: w.cold_ttft.p50)),
    _Row("TTFT cold p95", "s", False, Phase.WORKLOAD, _workload(lambda w: w.cold_ttft.p95)),
    _Row("TTFT warm p50", "s", False, Phase.WORKLOAD, _workload(lambda w: w.warm_ttft.p50)),
    _Row("TTFT warm p95", "s", False, Phase.WORKLOAD, _workload(lambda w: w.warm_ttft.p95)),
    _Row("Aggregate output", "tok/s", True, Phase.WORKLOAD, _workload(lambda w: w.output_tok_s)),
    _Row("Workload wall time", "s", False, Phase.WORKLOAD, _workload(lambda w: w.wall_s)),
    _Row("Aggregate ÷ single-stream", "×", True, Phase.WORKLOAD, _per_single_stream),
    _Row("Peak memory (RSS)", "MiB", False, None, _mib),
    _Row("Cache hit rate", "%", True, Phase.WORKLOAD, _workload(_hit_percent)),
)  # fmt: skip


def figures(result: BenchResult) -> list[Figure]:
    """The report's rows for the phases that ran, in order, each with the baseline's value
    when there is a baseline."""
    base = result.baseline
    return [
        Figure(
            row.name,
            row.unit,
            row.read(result),
            row.read(base) if base else None,
            row.higher_is_better,
        )
        for row in _ROWS
        if row.phase is None or row.phase in result.phases
    ]


def _fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "unknown"
    digits = {"s": 3, "×": 2, "MiB": 0}.get(unit, 1)
    return f"{value:,.{digits}f}"


def _ratio(figure: Figure) -> str:
    ratio = figure.ratio
    if ratio is None:
        return "—"
    # Two significant digits below 0.1, so a 500× faster TTFT does not print as "0.00×".
    return f"{ratio:.2f}×" if ratio >= 0.1 else f"{ratio:.2g}×"


def _title(result: BenchResult) -> str:
    spec = result.spec
    if Phase.WORKLOAD not in result.phases:
        return f"{result.model}: {', '.join(result.phases)}"
    return (
        f"{result.model}: {spec.agents} agents × {spec.turns} turns, "
        f"~{spec.system_tokens}-token system prompts, {spec.max_tokens} tokens per answer"
    )


def print_table(result: BenchResult, console: Console) -> None:
    legend = _legend(result) if result.baseline else None
    table = Table(title=f"semantic bench — {_title(result)}", caption=legend)
    table.add_column("Metric")
    table.add_column(result.target, justify="right")
    if result.baseline:
        table.add_column(BASELINE_LABEL, justify="right")
        table.add_column("ratio", justify="right")
    for figure in figures(result):
        cells = [figure.label, _fmt(figure.value, figure.unit)]
        if result.baseline:
            cells += [_fmt(figure.baseline, figure.unit), _ratio(figure)]
        table.add_row(*cells)
    console.print(table)
    cache_report.print_sections(_cache_sections(result), console)
    console.print(f"Machine: {result.machine}. Command: {result.command}", markup=False)
    for note in result.notes:
        console.print(f"Note: {note}", highlight=False, markup=False)


def _cache_sections(result: BenchResult) -> list[cache_report.Section]:
    return cache_report.sections(result.history, result.restart, result.pressure, result.crowd)


def _legend(result: BenchResult) -> str:
    return f"ratio = {result.target} ÷ baseline · ↑ higher is better · ↓ lower is better"


def to_json(result: BenchResult) -> dict[str, Any]:
    """The figures (with ratios) for a quick read, and the full record, every turn included."""
    # `ratio` is a property, not a field, so asdict() leaves it out.
    rows = [{**asdict(f), "ratio": f.ratio} for f in figures(result)]
    cache = cache_report.summary(result.history, result.restart, result.pressure, result.crowd)
    return {"figures": rows, "cache": cache, "result": asdict(result)}


def write_json(result: BenchResult, path: Path) -> None:
    path.write_text(json.dumps(to_json(result), indent=2, ensure_ascii=False) + "\n")


def to_markdown(result: BenchResult) -> str:
    """A self-contained section for docs/benchmark-history.md: setup line, table, how to read it."""
    base = result.baseline
    lines = [f"### {_title(result)} ({result.started_at[:10]})", "", _setup(result), ""]
    lines += ["```", result.command, "```", ""]
    lines += [
        f"| Metric | {result.target} | {BASELINE_LABEL} | ratio |",
        "|---|---:|---:|---:|",
    ]
    for figure in figures(result):
        theirs = _fmt(figure.baseline, figure.unit) if base else "not run"
        lines.append(
            f"| {figure.label} | {_fmt(figure.value, figure.unit)} | {theirs} | {_ratio(figure)} |"
        )
    lines += ["", *cache_report.markdown(_cache_sections(result))]
    lines += [f"Note: {note}." for note in result.notes]
    if set(BASELINE_PHASES) & set(result.phases):
        lines += ["", _notes(result)]
    lines.append("")
    return "\n".join(lines)


def write_markdown(result: BenchResult, path: Path) -> None:
    """The Markdown section, and beside it the run's charts as SVG, which it shows."""
    text = to_markdown(result)
    for chart in charts.of_run(result):
        svg = path.with_name(f"{path.stem}-{chart.slug}.svg")
        svg.write_text(chart.svg, encoding="utf-8")
        text += f"\n![{chart.title}]({svg.name})\n"
        text += f"\n{chart.note}\n" if chart.note else ""
    path.write_text(text, encoding="utf-8")


def _setup(result: BenchResult) -> str:
    base = result.baseline
    how = f"{base.library}, fp32, greedy, one request at a time" if base else "not run"
    return (
        f"Target: {result.target}. Machine: {result.machine}. "
        f"Baseline: `generate()` in-process ({how}). "
        f"Prompts were sized at {result.tokens_per_word:.2f} tokens per word. Command:"
    )


def _notes(result: BenchResult) -> str:
    return (
        f"Ratio = {result.target} ÷ baseline; ↑ higher is better, ↓ lower is better. "
        "TTFT is the time from sending a request to its first content token; cold = an agent's "
        "first turn, warm = its later turns (history resent, so only new tokens need prefill "
        "when the cache holds the rest). Agents run concurrently against the server; the "
        "baseline runs the same turns one at a time, so its TTFT is a lone request's. Decode "
        "tok/s = (completion tokens − 1) ÷ (last − first token time). Aggregate output = all "
        "completion tokens ÷ workload wall time. Peak memory: the server's VmHWM; for the "
        "baseline, the bench process that held the model."
    )
