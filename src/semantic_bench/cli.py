"""The `semantic bench` flags, and their translation into `BenchOptions`; the `semantic` command
owns the parser, this file only adds the verb's arguments to it."""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

from semantic_bench.errors import BenchError
from semantic_bench.options import BenchOptions, Clients, Phase


def add_bench_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags for `semantic bench`; anything after `--` goes to the spawned `semantic serve`."""
    defaults = BenchOptions()
    add = parser.add_argument
    add("--base-url", help="OpenAI-compatible server to measure, e.g. http://127.0.0.1:8080 "
        "(default: spawn `semantic serve` on a free port for the run)")  # fmt: skip
    add("--model", default=defaults.model, help="model alias or path; also the baseline's weights")
    add("--served-model", help="model name sent in requests (default: --model)")
    add("--api-key", help="sent as `Authorization: Bearer` to the target server")
    add("--agents", type=_positive, default=defaults.agents, help="concurrent agents")
    add("--turns", type=_positive, default=defaults.turns, help="turns per agent")
    add("--system-tokens", type=_positive, default=defaults.system_tokens,
        help="tokens in each agent's system prompt (roughly)")  # fmt: skip
    add("--user-tokens", type=_positive, default=defaults.user_tokens,
        help="tokens in each user message (roughly)")  # fmt: skip
    add("--max-tokens", type=_positive, default=defaults.max_tokens, help="tokens per answer")
    add("--seed", type=int, default=defaults.seed, help="seed of the prompt text")
    add("--no-baseline", dest="baseline", action="store_false",
        help="skip the transformers generate() baseline")  # fmt: skip
    add("--phases", type=_phases, default=defaults.phases,
        help="comma-separated phases to run (they run in this order): "
        f"{','.join(Phase)} (default: all that apply)")  # fmt: skip
    add("--history-sizes", type=_sizes, default=defaults.history_sizes,
        help="history phase: tokens of history, comma-separated (default: 1000,2000,4000); "
        "the restart phase uses the largest")  # fmt: skip
    add("--repeats", type=_positive, default=defaults.repeats,
        help="history phase: warm and cold probes per size (medians are reported)")  # fmt: skip
    add("--restart-agents", type=_positive, default=defaults.restart_agents,
        help="restart phase: agents whose caches must survive the restart")  # fmt: skip
    add("--pressure-agents", type=_positive, default=defaults.pressure_agents,
        help="pressure phase: agents taking turns round-robin")  # fmt: skip
    add("--pressure-turns", type=_at_least_two, default=defaults.pressure_turns,
        help="pressure phase: turns per agent (at least 2)")  # fmt: skip
    add("--crowd-agents", type=_positive, default=defaults.crowd_agents,
        help="crowd phase: agents running at once")  # fmt: skip
    add("--crowd-turns", type=_at_least_two, default=defaults.crowd_turns,
        help="crowd phase: turns per agent (at least 2)")  # fmt: skip
    add("--crowd-system-tokens", type=_positive,
        help="crowd phase: tokens in each agent's system prompt "
        "(default: --system-tokens)")  # fmt: skip
    add("--crowd-answer-tokens", type=_positive, default=defaults.crowd_answer_tokens,
        help="crowd phase: tokens per answer")  # fmt: skip
    add("--crowd-pool-factor", type=_positive_float, default=defaults.crowd_pool_factor,
        help="crowd phase: all agents' final histories ÷ the pool of the server the bench "
        "spawns (a --cache-budget-mb after -- wins)")  # fmt: skip
    add("--crowd-clients", type=_clients, default=defaults.crowd_clients,
        help="crowd phase: named (a session_id per agent), anonymous (no session id, as most "
        "agent frameworks send) or both, each on a fresh server (default: both)")  # fmt: skip
    add("--cache-dir", type=Path,
        help="cache folder for the spawned server (default: a fresh temporary folder, "
        "removed afterwards, so no run reuses an old cache unless asked)")  # fmt: skip
    add("--json", dest="json_out", type=Path, help="write the full result as JSON here")
    add("--markdown", dest="markdown_out", type=Path,
        help="write a Markdown section for docs/benchmark-history.md here, and its charts "
        "beside it as FILE-<chart>.svg")  # fmt: skip
    add("server_args", nargs="*", metavar="-- SERVER_ARGS",
        help="after --: flags for the spawned server, e.g. -- --cache-budget-mb 1024")  # fmt: skip


def options_from_args(args: argparse.Namespace, argv: Sequence[str] | None = None) -> BenchOptions:
    """`argv` (default: this process's arguments) is quoted in the report as the command."""
    return BenchOptions(
        base_url=args.base_url,
        model=args.model,
        agents=args.agents,
        turns=args.turns,
        system_tokens=args.system_tokens,
        user_tokens=args.user_tokens,
        max_tokens=args.max_tokens,
        baseline=args.baseline,
        json_out=args.json_out,
        markdown_out=args.markdown_out,
        server_args=list(args.server_args),
        served_model=args.served_model,
        api_key=args.api_key,
        seed=args.seed,
        phases=args.phases,
        history_sizes=args.history_sizes,
        repeats=args.repeats,
        restart_agents=args.restart_agents,
        pressure_agents=args.pressure_agents,
        pressure_turns=args.pressure_turns,
        crowd_agents=args.crowd_agents,
        crowd_turns=args.crowd_turns,
        crowd_system_tokens=args.crowd_system_tokens,
        crowd_answer_tokens=args.crowd_answer_tokens,
        crowd_pool_factor=args.crowd_pool_factor,
        crowd_clients=args.crowd_clients,
        cache_dir=args.cache_dir,
        command=shlex.join(["semantic", *(sys.argv[1:] if argv is None else argv)]),
    )


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _at_least_two(text: str) -> int:
    value = int(text)
    if value < 2:
        raise argparse.ArgumentTypeError(f"must be at least 2, got {value}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be above 0, got {value}")
    return value


def _clients(text: str) -> tuple[Clients, ...]:
    try:
        return Clients.parse(text)
    except BenchError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def _phases(text: str) -> tuple[Phase, ...]:
    try:
        return Phase.parse(text)
    except BenchError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def _sizes(text: str) -> tuple[int, ...]:
    try:
        return tuple(sorted({int(size) for size in text.split(",") if size.strip()}))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected tokens like 1000,2000,4000: {exc}") from exc
