"""`semantic bench`: the benchmark client, `semantic_bench`, behind the verb. Its parser is built
on every start (`semantic_bench/cli.py` imports little); the rest loads only when it runs."""

from __future__ import annotations

import argparse

from semantic.settings.flags import Parser


def add_parser(verbs: argparse._SubParsersAction[Parser]) -> None:
    from semantic_bench.cli import add_bench_arguments

    bench = verbs.add_parser("bench", help="benchmark an OpenAI-compatible server")
    add_bench_arguments(bench)
    bench.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from semantic_bench.cli import options_from_args
    from semantic_bench.run import run_bench

    run_bench(options_from_args(args))
    return 0
