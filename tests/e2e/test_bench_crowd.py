"""The crowd phase for real: a tiny crowd (three agents, two turns, short prompts) against
`semantic serve` with the small pool the bench would size for it, both kinds of client; it must
finish without an error, and its figures must agree with the server's own counters."""

from __future__ import annotations

import asyncio
import secrets
from pathlib import Path

import pytest

from semantic_bench.conversation import Chat
from semantic_bench.crowd import CrowdRun, run_crowd
from semantic_bench.options import BenchOptions, Clients
from semantic_bench.plan import build_plan
from semantic_bench.pool_phases import crowd_budget
from semantic_bench.pressure import PoolBudget
from semantic_bench.target import open_client
from tests.e2e.conftest import Server

pytestmark = pytest.mark.e2e

TOKENS_PER_WORD = 1.13  # SmolLM2's tokenizer on the bench's sentences, as calibration measured
SMALL_BLOCKS = ["--block-tokens", "16"]  # the default 256 would round each tiny history up
TINY = BenchOptions(
    system_tokens=120,
    user_tokens=16,
    crowd_agents=3,
    crowd_turns=2,
    crowd_answer_tokens=8,
    server_args=SMALL_BLOCKS,
)


def test_a_tiny_crowd_over_a_small_pool_finishes_and_agrees_with_the_servers_counters(
    tmp_path: Path,
) -> None:
    budget = crowd_budget(TINY)  # the pool a spawned run would get
    assert budget.needed_mb / budget.budget_mb > 1.2  # the histories do not all fit
    args = ["--cache-dir", str(tmp_path / "cache"), "--cache-budget-mb", str(budget.budget_mb)]
    server = Server([*args, *SMALL_BLOCKS], tmp_path / "server.log")
    try:
        server.wait_ready()
        # One server for both, in the bench's order, as against a given URL.
        runs = [asyncio.run(_crowd(server.url, clients, budget)) for clients in Clients]
    finally:
        server.stop()
    assert [run.clients for run in runs] == [Clients.ANONYMOUS, Clients.NAMED]
    for run in runs:
        assert run.errors == [], server.log()
        assert len(run.turns) == 6 and len(run.warm_turns) == 3
        assert all(t.completion_tokens == 8 for t in run.turns)  # min_tokens was honoured
        assert run.hit_rate is not None and 0.5 < run.hit_rate <= 1.0
        assert run.prefill_ratio is not None and run.prefill_ratio > 0.9
        assert run.cache is not None  # semantic has /admin/cache
        served = run.cache.hit_tokens_memory + run.cache.hit_tokens_disk + run.cache.miss_tokens
        assert served == sum(t.prompt_tokens for t in run.turns)
        assert run.warm_ttft.p50 is not None and run.output_tok_s > 0


async def _crowd(url: str, clients: Clients, budget: PoolBudget) -> CrowdRun:
    """The crowd alone, on prompts sized at SmolLM2's tokens per word: `run_bench` would first
    calibrate, and its named calibration prompt would take much of so small a pool."""
    spec = TINY.crowd_spec
    plan = build_plan(spec, TOKENS_PER_WORD, secrets.token_hex(3))
    async with open_client(url, TINY, spec.agents) as client:
        return await run_crowd(Chat(client, TINY.model, plan), spec, clients, budget, _quiet)


def _quiet(note: str) -> None:
    pass
