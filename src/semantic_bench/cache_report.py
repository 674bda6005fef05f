"""The cache phases in the report: history scaling, after a restart, pressure and crowd, each built
once as a `Section` (title, columns, rows, caption) and rendered as a rich table or as Markdown,
so the terminal and docs/benchmark-history.md never drift apart; plus their derived figures for
JSON."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.table import Table

from semantic_bench.cache_counters import CacheCounters
from semantic_bench.crowd import CrowdResult, CrowdRun
from semantic_bench.history import HistoryResult
from semantic_bench.options import Clients
from semantic_bench.pressure import MISS_SHARE, PressureResult
from semantic_bench.restart import RestartResult
from semantic_bench.workload import LatencySummary


@dataclass(slots=True)
class Section:
    title: str
    columns: list[str]
    rows: list[list[str]]
    caption: str


def _s(value: float | None) -> str:
    return "unknown" if value is None else f"{value:,.3f}"


def _x(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}×"


def _agents(count: int) -> str:
    return f"{count} agent" if count == 1 else f"{count} agents"


def _pct(value: float | None) -> str:
    return "unknown" if value is None else f"{value * 100:.1f}%"


def sections(
    history: HistoryResult | None,
    restart: RestartResult | None,
    pressure: PressureResult | None,
    crowd: CrowdResult | None,
) -> list[Section]:
    out = [_history(history)] if history else []
    out += [_restart(restart)] if restart else []
    out += [_pressure(pressure)] if pressure else []
    return out + ([_crowd(crowd)] if crowd else [])


def _history(result: HistoryResult) -> Section:
    columns = [
        "History (tokens)",
        "Prompt (tokens)",
        "TTFT cold (s)",
        "TTFT warm (s)",
        "cold ÷ warm",
        "warm: cached ÷ prompt",
        "cold: cached ÷ prompt",
        "KV held (MiB)",
        "KV ÷ full attention",
    ]
    rows = [
        [
            f"{p.history_tokens:,}",
            f"{p.prompt_tokens:,}",
            _s(p.cold_ttft_s),
            _s(p.warm_ttft_s),
            _x(p.speedup),
            _pct(p.warm_cached_share),
            _pct(p.cold_cached_share),
            "unknown" if p.kv is None else f"{p.kv.held / 2**20:,.1f}",
            _pct(None if p.kv is None else p.kv.share),
        ]
        for p in result.points
    ]
    mismatch = max(p.token_mismatch for p in result.points)
    return Section(
        f"History scaling: cold vs warm TTFT (median of {result.repeats})",
        columns,
        rows,
        f"{_flatness(result)} Cold = the same prompt with its first character changed, under a "
        f"fresh session id; its length matched the warm prompt's to within {mismatch:.2%}. "
        "KV held: what the server's pool keeps for the history once built (its /admin/cache), "
        "against every layer's K/V for every block of it (less with sliding windows).",
    )


def _flatness(result: HistoryResult) -> str:
    sizes = sorted(p.target_tokens for p in result.points)
    if result.flatness is None:
        return "Flatness needs two history sizes."
    return (
        f"Flatness: warm TTFT at {sizes[-1]:,} ÷ at {sizes[0]:,} tokens = "
        f"{_x(result.flatness)} (1.00× = flat)."
    )


def _restart(result: RestartResult) -> Section:
    columns = [
        "Agent",
        "History (tokens)",
        "Cached (tokens)",
        "cached ÷ history",
        "TTFT (s)",
        "÷ cold TTFT",
    ]
    cold = result.cold_ttft_s
    rows = [
        [
            str(t.agent),
            f"{t.history_tokens:,}",
            f"{t.probe.cached_tokens or 0:,}",
            _pct(t.history_share),
            _s(t.probe.ttft_s),
            _x(t.probe.ttft_s / cold if cold else None),
        ]
        for t in result.turns
    ]
    rows.append(["median", "", "", "", _s(result.ttft_s), _x(result.ratio_to_cold)])
    timing = result.timing
    source = "measured here" if result.cold_measured_here else "from the history phase"
    return Section(
        f"After a restart: {_agents(len(result.turns))} at ~{result.target_tokens:,} tokens",
        columns,
        rows,
        f"Restart: SIGTERM → exit {timing.stop_s:.1f} s (exit code {timing.exit_code}), "
        f"start → ready {timing.ready_s:.1f} s. Cold TTFT at this size: {_s(cold)} s "
        f"({source}). Cached ÷ prompt over the agents: {_pct(result.cached_share)}.",
    )


def _pressure(result: PressureResult) -> Section:
    budget = result.budget
    pool = (
        f"{budget.budget_mb:,} MiB for {budget.needed_mb:,.0f} MiB of histories"
        if budget
        else "the server's own (not spawned by the bench)"
    )
    warm, cold = result.warm_ttft, result.cold_ttft
    rows = [
        ["KV pool", pool],
        ["Warm-turn hit rate (Σ cached ÷ Σ prompt)", _pct(result.hit_rate)],
        ["Misses (warm turns)", f"{result.misses} of {len(result.warm_turns)}"],
        ["TTFT warm p50 / p95 (s)", f"{_s(warm.p50)} / {_s(warm.p95)}"],
        ["TTFT cold p50 (s)", _s(cold.p50)],
    ]
    return Section(
        f"Pressure: {_agents(result.agents)} × {result.turns_per_agent} turns, round-robin",
        ["Metric", "Value"],
        rows,
        f"A miss is a warm turn that reused under {MISS_SHARE:.0%} of its history. Turns run "
        "one at a time, so the agent whose turn comes next is always the least recently used.",
    )


_CLIENTS = {
    Clients.ANONYMOUS: "anonymous (no session id)",
    Clients.NAMED: "named (session_id)",
}


def _crowd(result: CrowdResult) -> Section:
    spec = result.spec
    rows = [
        ["KV pool", *(_pool(run) for run in result.runs)],
        ["Warm hit rate (Σ cached ÷ Σ history)", *(_pct(r.hit_rate) for r in result.runs)],
        ["Warm turns: prefilled ÷ new tokens", *(_x(r.prefill_ratio) for r in result.runs)],
        ["Prompt tokens from memory / disk / prefilled", *(_tokens(r.cache) for r in result.runs)],
        ["Miss reasons (requests)", *(_reasons(r.cache) for r in result.runs)],
        ["Disk blocks read / written", *(_disk(r.cache) for r in result.runs)],
        ["TTFT warm p50 / p95 (s)", *(_p50_p95(r.warm_ttft) for r in result.runs)],
        ["TTFT cold p50 / p95 (s)", *(_p50_p95(r.cold_ttft) for r in result.runs)],
        ["Inter-token latency p50 / p95 (s)", *(_p50_p95(r.inter_token) for r in result.runs)],
        ["Longest gap in an answer (s)", *(_s(r.longest_gap_s) for r in result.runs)],
        ["Aggregate output (tok/s)", *(f"{r.output_tok_s:,.1f}" for r in result.runs)],
        ["Wall time (s)", *(f"{r.wall_s:,.1f}" for r in result.runs)],
        ["Errors (requests)", *(str(len(r.errors)) for r in result.runs)],
    ]
    first_errors = [f"First error, {r.clients}: {r.errors[0]}." for r in result.runs if r.errors]
    return Section(
        f"Crowd: {_agents(spec.agents)} at once × {spec.turns} turns, "
        f"~{spec.system_tokens:,}-token system prompts, {spec.max_tokens}-token answers",
        ["Metric", *(_CLIENTS[run.clients] for run in result.runs)],
        rows,
        " ".join([_CROWD_CAPTION, *first_errors]),
    )


_CROWD_CAPTION = (
    "Every agent sends its next turn as soon as its answer arrives. Hit rate: tokens served "
    "from cache ÷ the agent's previous prompt and answer, over warm turns (a turn is credited "
    "at most its history). Prefilled ÷ new: (prompt − cached) ÷ (prompt − history) over warm "
    "turns; 1.00× means they paid for their new tokens only. Inter-token latency: the time "
    "between two streamed tokens of one answer, over every answer; the longest gap is its worst "
    "case (an answer preempted for a newcomer waits there). Tokens, miss reasons and disk "
    "blocks are the server's GET /admin/cache over the run (unknown where it has none). Each "
    "kind of client ran on a fresh server with a fresh cache folder when the bench spawned it."
)


def _pool(run: CrowdRun) -> str:
    budget = run.budget
    if budget is None:
        return "the server's own"
    return f"{budget.budget_mb:,} MiB for {budget.needed_mb:,.0f} MiB of histories"


def _tokens(cache: CacheCounters | None) -> str:
    if cache is None:
        return "unknown"
    return f"{cache.hit_tokens_memory:,} / {cache.hit_tokens_disk:,} / {cache.miss_tokens:,}"


def _reasons(cache: CacheCounters | None) -> str:
    if cache is None:
        return "unknown"
    reasons = sorted(cache.miss_reasons.items(), key=lambda item: (-item[1], item[0]))
    return ", ".join(f"{reason} {count:,}" for reason, count in reasons) or "none"


def _disk(cache: CacheCounters | None) -> str:
    return "unknown" if cache is None else f"{cache.restored:,} / {cache.disk_writes:,}"


def _p50_p95(summary: LatencySummary) -> str:
    return f"{_s(summary.p50)} / {_s(summary.p95)}"


def print_sections(parts: list[Section], console: Console) -> None:
    for part in parts:
        table = Table(title=part.title, caption=part.caption)
        for i, column in enumerate(part.columns):
            table.add_column(column, justify="left" if i == 0 else "right")
        for row in part.rows:
            table.add_row(*row)
        console.print(table)


def markdown(parts: list[Section]) -> list[str]:
    lines: list[str] = []
    for part in parts:
        lines += [f"#### {part.title}", "", "| " + " | ".join(part.columns) + " |"]
        lines.append("|---|" + "---:|" * (len(part.columns) - 1))
        lines += [_markdown_row(row) for row in part.rows]
        lines += ["", part.caption, ""]
    return lines


def _markdown_row(cells: list[str]) -> str:
    # A "|" of a cell's own (a miss reason the server named) would split it in two.
    return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"


def summary(
    history: HistoryResult | None,
    restart: RestartResult | None,
    pressure: PressureResult | None,
    crowd: CrowdResult | None,
) -> dict[str, Any]:
    """The derived figures (medians, ratios, rates) that `asdict` leaves out, for JSON."""
    out: dict[str, Any] = {}
    if history:
        points = [
            {
                "target_tokens": p.target_tokens,
                "history_tokens": p.history_tokens,
                "prompt_tokens": p.prompt_tokens,
                "cold_ttft_s": p.cold_ttft_s,
                "warm_ttft_s": p.warm_ttft_s,
                "cold_over_warm": p.speedup,
                "warm_cached_share": p.warm_cached_share,
                "cold_cached_share": p.cold_cached_share,
                "token_mismatch": p.token_mismatch,
                "kv_held_bytes": None if p.kv is None else p.kv.held,
                "kv_full_attention_bytes": None if p.kv is None else p.kv.full_attention,
            }
            for p in history.points
        ]
        out["history"] = {"points": points, "flatness": history.flatness}
    if restart:
        out["restart"] = {
            "ttft_s": restart.ttft_s,
            "cold_ttft_s": restart.cold_ttft_s,
            "ratio_to_cold": restart.ratio_to_cold,
            "cached_share": restart.cached_share,
        }
    if pressure:
        out["pressure"] = {
            "hit_rate": pressure.hit_rate,
            "misses": pressure.misses,
            "warm_turns": len(pressure.warm_turns),
            "warm_ttft_p50_s": pressure.warm_ttft.p50,
            "warm_ttft_p95_s": pressure.warm_ttft.p95,
        }
    if crowd:
        out["crowd"] = {run.clients.value: _crowd_figures(run) for run in crowd.runs}
    return out


def _crowd_figures(run: CrowdRun) -> dict[str, Any]:
    return {
        "hit_rate": run.hit_rate,
        "prefilled_over_new": run.prefill_ratio,
        "warm_turns": len(run.warm_turns),
        "warm_ttft_p50_s": run.warm_ttft.p50,
        "warm_ttft_p95_s": run.warm_ttft.p95,
        "cold_ttft_p50_s": run.cold_ttft.p50,
        "cold_ttft_p95_s": run.cold_ttft.p95,
        "inter_token_p50_s": run.inter_token.p50,
        "inter_token_p95_s": run.inter_token.p95,
        "longest_gap_s": run.longest_gap_s,
        "output_tok_s": run.output_tok_s,
        "wall_s": run.wall_s,
        "errors": len(run.errors),
    }
