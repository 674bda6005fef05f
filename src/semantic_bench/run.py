"""`run_bench`: reach the target server (or spawn `semantic serve` on a fresh cache folder), run
the chosen phases in order with progress shown, and render the report.

Order: calibration (always), decode, concurrent, prefill, workload, history, restart — on one
server; pressure, then crowd once per kind of client — each on a server of its own whose pool
the bench sizes (on the target itself when given a URL: `pool_phases.py`); the baseline last,
once every spawned server has stopped, so the two never share the CPU.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from pathlib import Path

import httpx
from rich.console import Console

from semantic_bench import baseline, report
from semantic_bench.baseline import BaselineResult
from semantic_bench.conversation import Chat, cold_markers
from semantic_bench.history import HISTORY_TURNS, HistoryResult, run_history
from semantic_bench.machine import Machine
from semantic_bench.options import BenchOptions, Phase
from semantic_bench.plan import BenchPlan, build_plan
from semantic_bench.pool_phases import PoolPhases
from semantic_bench.progress import PhaseProgress
from semantic_bench.report import BenchResult
from semantic_bench.restart import RESTART_TURNS, RestartResult, run_restart
from semantic_bench.server import RestartTiming, peak_rss_bytes
from semantic_bench.target import (
    READY_TIMEOUT_S,
    given_url,
    open_client,
    start_server,
)
from semantic_bench.workload import (
    ConcurrentDecodeResult,
    DecodeResult,
    PrefillResult,
    TurnResult,
    WorkloadResult,
    calibrate,
    measure_concurrent_decode,
    measure_decode,
    measure_prefill,
    run_workload,
)

__all__ = ["run_bench"]


@dataclass(slots=True)
class _ServerMeasurements:
    """What the phases on the target measured (None: not run), and the plan they ran, which
    the pressure phase and the baseline reuse."""

    plan: BenchPlan
    decode: DecodeResult | None = None
    concurrent: ConcurrentDecodeResult | None = None
    prefill: PrefillResult | None = None
    workload: WorkloadResult | None = None
    history: HistoryResult | None = None
    restart: RestartResult | None = None
    peak_rss_bytes: int | None = None


def run_bench(options: BenchOptions) -> BenchResult:
    """Run every phase that applies, print the table, write JSON/Markdown when asked."""
    started_at = datetime.now().astimezone().isoformat(timespec="seconds")
    phases = options.runnable_phases()
    # Calibration, each phase, and the crowd's runs beyond its first (one per kind of client).
    more_crowd_runs = len(options.crowd_clients) - 1 if Phase.CROWD in phases else 0
    progress = PhaseProgress(Console(stderr=True), phases=1 + len(phases) + more_crowd_runs)
    notes = options.skip_notes()
    for note in notes:
        progress.say(note)
    with tempfile.TemporaryDirectory(prefix="semantic-bench-") as scratch:
        cache_dir = options.cache_dir or Path(scratch) / "cache"
        measured = _target_phases(options, phases, cache_dir, progress)
        pools = PoolPhases(options, measured.plan, Path(scratch), progress)
        pressure = pools.pressure() if Phase.PRESSURE in phases else None
        crowd = pools.crowd() if Phase.CROWD in phases else None
    base = None
    if Phase.BASELINE in phases:
        base = _baseline_phase(options, phases, measured.plan, progress)
    result = BenchResult(
        target="semantic" if options.spawns else given_url(options),
        model=options.model,
        spec=options.spec,
        tokens_per_word=measured.plan.tokens_per_word,
        machine=Machine.this(),
        started_at=started_at,
        command=options.command or "run_bench() from Python",
        phases=phases,
        decode=measured.decode,
        concurrent=measured.concurrent,
        prefill=measured.prefill,
        workload=measured.workload,
        peak_rss_bytes=measured.peak_rss_bytes,
        baseline=base,
        history=measured.history,
        restart=measured.restart,
        pressure=pressure,
        crowd=crowd,
        notes=notes,
    )
    _render(result, options)
    return result


def _render(result: BenchResult, options: BenchOptions) -> None:
    report.print_table(result, Console())
    if options.json_out:
        report.write_json(result, options.json_out)
    if options.markdown_out:
        report.write_markdown(result, options.markdown_out)


def _target_phases(
    options: BenchOptions, phases: tuple[Phase, ...], cache_dir: Path, progress: PhaseProgress
) -> _ServerMeasurements:
    """Calibration and every phase up to the restart, on the target (spawned or given)."""
    if not options.spawns:
        return asyncio.run(_server_phases(given_url(options), options, phases, None, progress))
    server = start_server(options, options.server_args, cache_dir, progress)
    try:
        restart = partial(server.restart, READY_TIMEOUT_S)
        measured = asyncio.run(_server_phases(server.base_url, options, phases, restart, progress))
        measured.peak_rss_bytes = server.peak_rss_bytes()
    finally:
        server.stop()
    return measured


async def _server_phases(
    base_url: str,
    options: BenchOptions,
    phases: tuple[Phase, ...],
    restart: Callable[[], RestartTiming] | None,
    progress: PhaseProgress,
) -> _ServerMeasurements:
    model = options.served_model or options.model
    streams = max(options.agents, options.restart_agents)
    async with open_client(base_url, options, streams) as client:
        with progress.phase("calibration", total=1) as step:
            run_tag = secrets.token_hex(3)
            plan = build_plan(options.spec, await calibrate(client, model, run_tag), run_tag)
            step(f"{plan.tokens_per_word:.2f} tokens/word")
        out = _ServerMeasurements(plan)
        await _speed_phases(client, model, options, phases, out, progress)
        await _cache_phases(Chat(client, model, plan), options, phases, restart, out, progress)
    return out


async def _speed_phases(
    client: httpx.AsyncClient,
    model: str,
    options: BenchOptions,
    phases: tuple[Phase, ...],
    out: _ServerMeasurements,
    progress: PhaseProgress,
) -> None:
    plan = out.plan
    if Phase.DECODE in phases:
        with progress.phase("single-stream decode", total=1) as step:
            out.decode = await measure_decode(client, model, plan)
            step(f"{out.decode.tok_s:.1f} tok/s")
    if Phase.CONCURRENT in phases:
        streams = len(plan.concurrent_messages)
        with progress.phase(f"decode, {streams} streams at once", total=1) as step:
            out.concurrent = await measure_concurrent_decode(client, model, plan)
            step(f"{out.concurrent.tok_s:.1f} tok/s in all")
    if Phase.PREFILL in phases:
        with progress.phase("prefill", total=1) as step:
            out.prefill = await measure_prefill(client, model, plan)
            step(f"{out.prefill.tok_s:.0f} tok/s")
    if Phase.WORKLOAD in phases:
        turns = len(plan.agents) * options.turns
        with progress.phase("multi-agent workload", total=turns) as step:
            out.workload = await run_workload(client, model, plan, lambda t: step(_turn_note(t)))


async def _cache_phases(
    chat: Chat,
    options: BenchOptions,
    phases: tuple[Phase, ...],
    restart: Callable[[], RestartTiming] | None,
    out: _ServerMeasurements,
    progress: PhaseProgress,
) -> None:
    markers = cold_markers()  # shared: no two cold twins of a run start alike
    if Phase.HISTORY in phases:
        total = len(options.history_sizes) * (HISTORY_TURNS + 2 * options.repeats)
        with progress.phase("history scaling: cold vs warm TTFT", total=total) as step:
            out.history = await run_history(
                chat, options.history_sizes, options.repeats, markers, step
            )
    if Phase.RESTART in phases and restart is not None:
        size = max(options.history_sizes)
        point = out.history.at(size) if out.history else None
        cold = point.cold_ttft_s if point else None
        agents = options.restart_agents
        total = agents * RESTART_TURNS + 1 + agents + (cold is None)
        with progress.phase(f"restart: {agents} agents at {size:,} tokens", total=total) as step:
            out.restart = await run_restart(chat, size, agents, restart, cold, markers, step)


def _baseline_phase(
    options: BenchOptions, phases: tuple[Phase, ...], plan: BenchPlan, progress: PhaseProgress
) -> BaselineResult:
    """The transformers baseline of the decode, prefill and workload phases that ran."""
    # Imported here so that only a run with a baseline needs the registry.
    from semantic.models.registry import ModelRegistry

    path = ModelRegistry().resolve(options.model).path
    turns = len(plan.agents) * options.turns if Phase.WORKLOAD in phases else 0
    total = 1 + (Phase.DECODE in phases) + (Phase.PREFILL in phases) + turns
    decode = prefill = workload = None
    with progress.phase("baseline: transformers generate()", total=total) as step:
        model = baseline.load_model(path)
        step("model loaded")
        if Phase.DECODE in phases:
            decode = baseline.measure_decode(model, plan)
            step(f"decode {decode.tok_s:.1f} tok/s")
        if Phase.PREFILL in phases:
            prefill = baseline.measure_prefill(model, plan)
            step(f"prefill {prefill.tok_s:.0f} tok/s")
        if Phase.WORKLOAD in phases:
            workload = baseline.run_workload(model, plan, lambda t: step(_turn_note(t)))
    return BaselineResult(model.library, decode, prefill, workload, peak_rss_bytes(os.getpid()))


def _turn_note(turn: TurnResult) -> str:
    return f"agent {turn.agent} turn {turn.turn}: TTFT {turn.ttft_s:.2f} s"
