"""The bench records the report tests build by hand: a `BenchResult` with nothing measured but
what a test puts in, on a fixed machine and date, so a rendered line can be asserted whole."""

from __future__ import annotations

from typing import Any

from semantic_bench.machine import Machine
from semantic_bench.options import Phase
from semantic_bench.plan import WorkloadSpec
from semantic_bench.report import BenchResult

MACHINE = Machine("AMD EPYC", 2, "Linux x86_64", "2.13.0+cpu")


def bench_result(command: str, phases: tuple[Phase, ...], **measured: Any) -> BenchResult:
    """A run of `command` that took `phases`; `measured` sets the fields it filled in (or
    overrides the defaults: 8 agents × 3 turns, 1.3 tokens per word)."""
    nothing: dict[str, Any] = {
        "target": "semantic",
        "model": "smollm2-135m",
        "spec": WorkloadSpec(8, 3, 1000, 50, 64),
        "tokens_per_word": 1.3,
        "machine": MACHINE,
        "started_at": "2025-01-02T03:04:05+00:00",
        "decode": None,
        "prefill": None,
        "workload": None,
        "peak_rss_bytes": None,
        "baseline": None,
    }
    return BenchResult(command=command, phases=phases, **(nothing | measured))
