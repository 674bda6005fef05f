"""The `semantic` command: one parser, a verb for each module of `commands/`, and the exit code.

Each verb adds its own parser and flags (`commands/<verb>.py: add_parser`) and runs through the
handler it sets; what a verb needs beyond its flags it imports when it runs, so building the
parser, which every start does, stays cheap. A `SemanticError` from any verb is one line on
stderr and exit status 2.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from semantic import __version__
from semantic.commands import agents, bench, config, models, serve
from semantic.errors import SemanticError
from semantic.settings.errors import unknown_variables
from semantic.settings.flags import Parser

# In `--help`'s order.
_VERBS = (serve, config, models, agents, bench)

_ABOUT = """\
semantic: a local inference server for many LLM agents at once. Each agent's KV cache stays
between its turns, in memory or on disk, across restarts; clients speak the OpenAI or the
Anthropic API, or the direct agent API.

Start with `semantic serve` (http://127.0.0.1:8000, the built-in SmolLM2 model), then open
http://127.0.0.1:8000/docs for the API. Settings come from flags, SEMANTIC_* environment
variables, .env and a TOML file (--config): `semantic config` shows each one and where it came
from."""


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.verb is None:  # bare `semantic`: what it can do, not a usage error
        parser.print_help()
        return 0
    if args.verb != "bench":  # the commands that read the settings
        for warning in unknown_variables(os.environ):
            print(f"semantic: warning: {warning}", file=sys.stderr)
    try:
        return int(args.handler(args))
    except SemanticError as exc:
        print(f"semantic: {exc}", file=sys.stderr)
        return 2


def _parser() -> Parser:
    parser = Parser(prog="semantic", description=_ABOUT)
    parser.add_argument("--version", action="version", version=f"semantic {__version__}")
    verbs = parser.add_subparsers(
        dest="verb", title="commands", metavar="COMMAND", parser_class=Parser
    )
    for verb in _VERBS:
        verb.add_parser(verbs)
    return parser
