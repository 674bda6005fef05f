"""`run_bench`: reach the target server (or spawn `semantic serve` for the run), run the phases in
order with progress shown, then the `transformers` baseline, and render the report.

Phases: (1) calibration and single-stream decode, (2) prefill of one fresh ~1k-token prompt,
(3) the concurrent multi-agent workload, (4) the baseline. A spawned server is stopped before
the baseline, so the two never share the CPU.
"""

from __future__ import annotations

import asyncio
import os
import platform
import secrets
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import httpx
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from semantic.bench import baseline, report
from semantic.bench.baseline import BaselineResult
from semantic.bench.plan import BenchPlan, WorkloadSpec, build_plan
from semantic.bench.report import BenchResult
from semantic.bench.server import SpawnedServer, peak_rss_bytes
from semantic.bench.workload import (
    BenchError,
    DecodeResult,
    PrefillResult,
    TurnResult,
    WorkloadResult,
    calibrate,
    measure_decode,
    measure_prefill,
    run_workload,
)

READY_TIMEOUT_S = 600.0  # a cold start may load weights and warm caches from disk


@dataclass(slots=True)
class BenchOptions:
    """What to measure and how. `base_url=None` spawns `semantic serve` with `server_args`.
    `served_model` is the model name sent in requests (default: `model`), for servers such as
    vLLM or ollama that insist on their own name; `model` also picks the baseline's weights."""

    base_url: str | None = None
    model: str = "smollm2-135m"
    agents: int = 8
    turns: int = 3
    system_tokens: int = 1000
    user_tokens: int = 50
    max_tokens: int = 64
    baseline: bool = True
    json_out: Path | None = None
    markdown_out: Path | None = None
    server_args: list[str] = field(default_factory=list)
    served_model: str | None = None
    api_key: str | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        sizes = (self.agents, self.turns, self.system_tokens, self.user_tokens, self.max_tokens)
        if min(sizes) < 1:
            raise BenchError("agents, turns, system/user tokens and max_tokens must be ≥ 1")
        if self.base_url is not None and self.server_args:
            raise BenchError("server arguments after -- apply only when the bench spawns a server")

    @property
    def spec(self) -> WorkloadSpec:
        return WorkloadSpec(
            agents=self.agents,
            turns=self.turns,
            system_tokens=self.system_tokens,
            user_tokens=self.user_tokens,
            max_tokens=self.max_tokens,
            seed=self.seed,
        )


def run_bench(options: BenchOptions) -> BenchResult:
    """Run every phase, print the table, write JSON/Markdown when asked, return the record."""
    started_at = datetime.now().astimezone().isoformat(timespec="seconds")
    progress = PhaseProgress(Console(stderr=True), phases=4 if options.baseline else 3)
    server = _start_server(options, progress) if options.base_url is None else None
    try:
        base_url = server.base_url if server else normalize_base_url(options.base_url or "")
        measured = asyncio.run(_server_phases(base_url, options, progress))
        server_peak = server.peak_rss_bytes() if server else None  # unknown for a remote server
    finally:
        if server:
            server.stop()
    base = _baseline_phase(options, measured.plan, progress) if options.baseline else None
    result = BenchResult(
        target="semantic" if server else base_url,
        model=options.model,
        spec=options.spec,
        tokens_per_word=measured.plan.tokens_per_word,
        machine=machine_description(),
        started_at=started_at,
        decode=measured.decode,
        prefill=measured.prefill,
        workload=measured.workload,
        peak_rss_bytes=server_peak,
        baseline=base,
    )
    _render(result, options)
    return result


def normalize_base_url(url: str) -> str:
    """Accept both `http://host:port` and the OpenAI-SDK style `http://host:port/v1`."""
    return url.rstrip("/").removesuffix("/v1")


def machine_description() -> str:
    return f"{platform.system()} {platform.machine()}, {os.cpu_count()} CPUs"


def _render(result: BenchResult, options: BenchOptions) -> None:
    report.print_table(result, Console())
    if options.json_out:
        report.write_json(result, options.json_out)
    if options.markdown_out:
        report.write_markdown(result, options.markdown_out)


def _start_server(options: BenchOptions, progress: PhaseProgress) -> SpawnedServer:
    server = SpawnedServer.start(options.model, options.server_args)
    try:
        with progress.waiting(f"starting semantic serve at {server.base_url}"):
            server.wait_ready(READY_TIMEOUT_S)
    except BaseException:
        server.stop()
        raise
    return server


@dataclass(slots=True)
class _ServerMeasurements:
    """Phases 1–3, and the plan they ran, which the baseline runs again."""

    plan: BenchPlan
    decode: DecodeResult
    prefill: PrefillResult
    workload: WorkloadResult


async def _server_phases(
    base_url: str, options: BenchOptions, progress: PhaseProgress
) -> _ServerMeasurements:
    model = options.served_model or options.model
    headers = {"Authorization": f"Bearer {options.api_key}"} if options.api_key else {}
    # A generous read timeout: on a CPU, eight agents' cold prefills can take minutes.
    timeout = httpx.Timeout(600.0, connect=10.0)
    limits = httpx.Limits(max_connections=options.agents + 4)
    async with httpx.AsyncClient(
        base_url=base_url, headers=headers, timeout=timeout, limits=limits
    ) as client:
        with progress.phase("calibration and single-stream decode", total=2) as step:
            run_tag = secrets.token_hex(3)
            plan = build_plan(options.spec, await calibrate(client, model, run_tag), run_tag)
            step(f"{plan.tokens_per_word:.2f} tokens/word")
            decode = await measure_decode(client, model, plan)
            step(f"{decode.tok_s:.1f} tok/s")
        with progress.phase("prefill", total=1) as step:
            prefill = await measure_prefill(client, model, plan)
            step(f"{prefill.tok_s:.0f} tok/s")
        with progress.phase("multi-agent workload", total=len(plan.agents) * options.turns) as step:
            workload = await run_workload(client, model, plan, lambda t: step(_turn_note(t)))
    return _ServerMeasurements(plan, decode, prefill, workload)


def _baseline_phase(
    options: BenchOptions, plan: BenchPlan, progress: PhaseProgress
) -> BaselineResult:
    # Imported here so that only a run with a baseline needs the registry.
    from semantic.registry import ModelRegistry

    path = ModelRegistry().resolve(options.model).path
    total = 3 + len(plan.agents) * options.turns
    with progress.phase("baseline: transformers generate()", total=total) as step:
        model = baseline.load_model(path)
        step("model loaded")
        decode = baseline.measure_decode(model, plan)
        step(f"decode {decode.tok_s:.1f} tok/s")
        prefill = baseline.measure_prefill(model, plan)
        step(f"prefill {prefill.tok_s:.0f} tok/s")
        workload = baseline.run_workload(model, plan, lambda t: step(_turn_note(t)))
    return BaselineResult(model.library, decode, prefill, workload, peak_rss_bytes(os.getpid()))


def _turn_note(turn: TurnResult) -> str:
    return f"agent {turn.agent} turn {turn.turn}: TTFT {turn.ttft_s:.2f} s"


class PhaseProgress:
    """Shows each phase as it runs: a rich progress bar on a terminal, plain lines otherwise
    (logs, CI), numbered "phase 2/4" so a reader knows how far along the run is."""

    def __init__(self, console: Console, phases: int) -> None:
        self.console = console
        self.phases = phases
        self.current = 0

    @contextmanager
    def phase(self, title: str, total: int) -> Iterator[Callable[[str], None]]:
        """Yields `step(note)`, called once per unit of `total`."""
        self.current += 1
        title = f"phase {self.current}/{self.phases}: {title}"
        started = time.perf_counter()
        if self.console.is_terminal:
            with _bar(self.console) as bar:
                task = bar.add_task(title, total=total, note="")
                yield lambda note: bar.update(task, advance=1, note=note)
        else:
            self._say(title)
            count = iter(range(1, total + 1))
            yield lambda note: self._say(f"  {next(count, total)}/{total} {note}")
        self._say(f"{title}: done in {time.perf_counter() - started:.1f} s")

    @contextmanager
    def waiting(self, title: str) -> Iterator[None]:
        """A step with no count (server start-up): a spinner on a terminal."""
        started = time.perf_counter()
        if self.console.is_terminal:
            with self.console.status(title):
                yield
        else:
            self._say(title)
            yield
        self._say(f"{title}: ready in {time.perf_counter() - started:.1f} s")

    def _say(self, line: str) -> None:
        self.console.print(f"[bench] {line}", highlight=False, markup=False)


def _bar(console: Console) -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[note]}"),
        console=console,
    )
