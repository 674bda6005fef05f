"""The `semantic bench` flags, and their translation into `BenchOptions`; the `semantic` command
owns the parser, this file only adds the verb's arguments to it."""

from __future__ import annotations

import argparse
from pathlib import Path

from semantic.bench.run import BenchOptions


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
    add("--json", dest="json_out", type=Path, help="write the full result as JSON here")
    add("--markdown", dest="markdown_out", type=Path,
        help="write a Markdown section for docs/benchmarks.md here")  # fmt: skip
    add("server_args", nargs="*", metavar="-- SERVER_ARGS",
        help="after --: flags for the spawned server, e.g. -- --cache-budget-mb 1024")  # fmt: skip


def options_from_args(args: argparse.Namespace) -> BenchOptions:
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
    )


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value
