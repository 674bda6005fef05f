"""The phases that need a pool smaller than their agents' histories — pressure (one turn at a
time) and crowd (all agents at once) — each run on a server the bench spawns for it, with a
fresh cache folder and a pool it sizes from the phase's shape; on the target itself when given
a URL, whose pool is what it is."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TypeVar

from semantic_bench.conversation import Chat
from semantic_bench.crowd import CrowdResult, CrowdRun, run_crowd
from semantic_bench.errors import BenchError
from semantic_bench.options import BenchOptions, Clients
from semantic_bench.plan import BenchPlan
from semantic_bench.pressure import PoolBudget, PressureResult, pool_budget, run_pressure
from semantic_bench.progress import PhaseProgress
from semantic_bench.server import flag_value, kv_bytes_per_token, server_block_tokens
from semantic_bench.target import given_url, open_client, start_server

T = TypeVar("T")
BUDGET_FLAG = "--cache-budget-mb"


@dataclass(slots=True)
class PoolPhases:
    """Runs the pool phases of one bench run: its options, the plan calibration made (its tag
    and tokens per word size every prompt), a scratch folder for the cache folders, and the
    run's progress display."""

    options: BenchOptions
    plan: BenchPlan
    scratch: Path
    progress: PhaseProgress

    def pressure(self) -> PressureResult:
        """Pressure on a pool that holds well under all its agents at once."""
        options, spec = self.options, self.options.pressure_spec
        budget = None
        if options.spawns:
            budget = pool_budget(spec, kv_bytes_per_token(options.model, options.server_args))
        title = f"pressure: {spec.agents} agents × {spec.turns} turns{_pool(budget)}"

        async def work(chat: Chat) -> PressureResult:
            with self.progress.phase(title, total=spec.agents * spec.turns) as step:
                return await run_pressure(chat, spec, budget, step)

        return self._on_own_server(budget, "pressure-cache", 1, work)

    def crowd(self) -> CrowdResult:
        """The crowd once per kind of client asked for, each on a fresh server (a fresh cache)."""
        options, spec = self.options, self.options.crowd_spec
        budget = crowd_budget(options) if options.spawns else None
        result = CrowdResult(spec)
        for clients in options.crowd_clients:
            title = (
                f"crowd, {clients} clients: {spec.agents} agents at once × {spec.turns} turns"
                f"{_pool(budget)}"
            )

            async def work(chat: Chat, clients: Clients = clients, title: str = title) -> CrowdRun:
                with self.progress.phase(title, total=spec.agents * spec.turns) as step:
                    return await run_crowd(chat, spec, clients, budget, step)

            cache = f"crowd-{clients}-cache"
            result.runs.append(self._on_own_server(budget, cache, spec.agents, work))
        return result

    def _on_own_server(
        self,
        budget: PoolBudget | None,
        cache_name: str,
        streams: int,
        work: Callable[[Chat], Awaitable[T]],
    ) -> T:
        """`work(chat)` on a server of its own, on a fresh cache folder named `cache_name`, with
        the pool `budget` sizes; on the target given by URL when there is no budget."""
        if budget is None:
            return asyncio.run(self._with_chat(given_url(self.options), streams, work))
        server_args = [*self.options.server_args, BUDGET_FLAG, str(budget.budget_mb)]
        cache_dir = self.scratch / cache_name
        server = start_server(self.options, server_args, cache_dir, self.progress)
        try:
            return asyncio.run(self._with_chat(server.base_url, streams, work))
        finally:
            server.stop()

    async def _with_chat(
        self, base_url: str, streams: int, work: Callable[[Chat], Awaitable[T]]
    ) -> T:
        options = self.options
        async with open_client(base_url, options, streams) as client:
            return await work(Chat(client, options.served_model or options.model, self.plan))


def crowd_budget(options: BenchOptions) -> PoolBudget:
    """A pool that every agent's final history at once (in whole blocks) overfills
    `crowd_pool_factor` times, with room for one agent at least; a `--cache-budget-mb` among
    the server arguments wins."""
    server_args = options.server_args
    given = flag_value(server_args, BUDGET_FLAG)
    if given is not None and not given.isdigit():
        raise BenchError(f"{BUDGET_FLAG} {given!r} after -- is not a number of MiB")
    bytes_per_token = kv_bytes_per_token(options.model, server_args)
    share = 1 / options.crowd_pool_factor
    block_tokens = server_block_tokens(server_args)
    budget = pool_budget(options.crowd_spec, bytes_per_token, share, 1, block_tokens)
    return budget if given is None else replace(budget, budget_mb=int(given))


def _pool(budget: PoolBudget | None) -> str:
    return f", {budget.budget_mb} MiB pool" if budget else ""
