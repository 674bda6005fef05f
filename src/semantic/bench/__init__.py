"""`semantic bench`: the multi-agent, multi-turn benchmark of any OpenAI-compatible server, with
the same model through `transformers` `generate()` as its baseline."""

from __future__ import annotations

from semantic.bench.options import BenchOptions
from semantic.bench.report import BenchResult
from semantic.bench.run import run_bench

__all__ = ["BenchOptions", "BenchResult", "run_bench"]
