"""The record of one bench run and its three renderings: a rich table for the terminal, JSON for
machines, and a Markdown section for docs/benchmarks.md. Every figure sits beside its ratio to
the `transformers` baseline, so no number is read without its reference."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

from rich.console import Console
from rich.table import Table

from semantic.bench.baseline import BaselineResult
from semantic.bench.plan import WorkloadSpec
from semantic.bench.workload import DecodeResult, PrefillResult, WorkloadResult

BASELINE_LABEL = "transformers generate()"


@dataclass(slots=True)
class BenchResult:
    """Everything one run measured. `target` names the server measured ("semantic" when the
    bench spawned it, else its base URL); `peak_rss_bytes` is None where it can't be read."""

    target: str
    model: str
    spec: WorkloadSpec
    tokens_per_word: float
    machine: str
    started_at: str  # ISO 8601, local time
    decode: DecodeResult
    prefill: PrefillResult
    workload: WorkloadResult
    peak_rss_bytes: int | None
    baseline: BaselineResult | None


class _Measured(Protocol):
    """What both a `BenchResult` and a `BaselineResult` carry, so one getter reads either."""

    decode: DecodeResult
    prefill: PrefillResult
    workload: WorkloadResult
    peak_rss_bytes: int | None


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


def _per_single_stream(m: _Measured) -> float | None:
    return m.workload.output_tok_s / m.decode.tok_s if m.decode.tok_s else None


def _mib(m: _Measured) -> float | None:
    return m.peak_rss_bytes / 2**20 if m.peak_rss_bytes is not None else None


def _hit_percent(m: _Measured) -> float | None:
    rate = m.workload.cache_hit_rate
    return rate * 100 if rate is not None else None


# (name, unit, higher is better, how to read it from either side)
_ROWS: tuple[tuple[str, str, bool, Callable[[_Measured], float | None]], ...] = (
    ("Single-stream decode", "tok/s", True, lambda m: m.decode.tok_s),
    ("Prefill, one fresh ~1k-token prompt", "tok/s", True, lambda m: m.prefill.tok_s),
    ("TTFT cold p50", "s", False, lambda m: m.workload.cold_ttft.p50),
    ("TTFT cold p95", "s", False, lambda m: m.workload.cold_ttft.p95),
    ("TTFT warm p50", "s", False, lambda m: m.workload.warm_ttft.p50),
    ("TTFT warm p95", "s", False, lambda m: m.workload.warm_ttft.p95),
    ("Aggregate output", "tok/s", True, lambda m: m.workload.output_tok_s),
    ("Workload wall time", "s", False, lambda m: m.workload.wall_s),
    ("Aggregate ÷ single-stream", "×", True, _per_single_stream),
    ("Peak memory (RSS)", "MiB", False, _mib),
    ("Cache hit rate", "%", True, _hit_percent),
)


def figures(result: BenchResult) -> list[Figure]:
    """The report's rows, in order, each with the baseline's value when there is a baseline."""
    base = result.baseline
    return [
        Figure(name, unit, read(result), read(base) if base else None, higher)
        for name, unit, higher, read in _ROWS
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


def _legend(result: BenchResult) -> str:
    return f"ratio = {result.target} ÷ baseline · ↑ higher is better · ↓ lower is better"


def to_json(result: BenchResult) -> dict[str, Any]:
    """The figures (with ratios) for a quick read, and the full record, every turn included."""
    # `ratio` is a property, not a field, so asdict() leaves it out.
    rows = [{**asdict(f), "ratio": f.ratio} for f in figures(result)]
    return {"figures": rows, "result": asdict(result)}


def write_json(result: BenchResult, path: Path) -> None:
    path.write_text(json.dumps(to_json(result), indent=2, ensure_ascii=False) + "\n")


def to_markdown(result: BenchResult) -> str:
    """A self-contained section for docs/benchmarks.md: setup line, table, how to read it."""
    base = result.baseline
    lines = [f"### {_title(result)} ({result.started_at[:10]})", "", _setup(result), ""]
    lines += [
        f"| Metric | {result.target} | {BASELINE_LABEL} | ratio |",
        "|---|---:|---:|---:|",
    ]
    for figure in figures(result):
        theirs = _fmt(figure.baseline, figure.unit) if base else "not run"
        lines.append(
            f"| {figure.label} | {_fmt(figure.value, figure.unit)} | {theirs} | {_ratio(figure)} |"
        )
    lines += ["", _notes(result), ""]
    return "\n".join(lines)


def write_markdown(result: BenchResult, path: Path) -> None:
    path.write_text(to_markdown(result), encoding="utf-8")


def _setup(result: BenchResult) -> str:
    base = result.baseline
    how = f"{base.library}, fp32, greedy, one request at a time" if base else "not run"
    return (
        f"Target: {result.target}. Machine: {result.machine}. "
        f"Baseline: `generate()` in-process ({how}). "
        f"Workload prompts were sized at {result.tokens_per_word:.2f} tokens per word."
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
