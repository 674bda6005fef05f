"""`semantic serve`: check what can fail before the load (`preflight.py`), load the model
(`loader.py`), then serve the OpenAI, Anthropic and agent APIs until a stop signal drains them."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from typing import TYPE_CHECKING

from semantic.settings.flags import SETTINGS_USAGE, Parser, add_settings_flags, settings_from

if TYPE_CHECKING:
    from semantic.commands.preflight import Checked
    from semantic.engine.host import EngineHost

_ABOUT = """\
Load the model, then serve the OpenAI, Anthropic and agent APIs (http://127.0.0.1:8000 by
default; the API's own documentation at /docs). Everything that can fail before the load (the
port, the cache folder, the model's path, the settings) is checked first.

Each setting below is a flag, an environment variable (shown) and a key of the TOML file that
--config names; a flag wins over the environment, .env and the file."""


def add_parser(verbs: argparse._SubParsersAction[Parser]) -> None:
    serve = verbs.add_parser(
        "serve", help="start the HTTP server", description=_ABOUT, usage=SETTINGS_USAGE
    )
    add_settings_flags(serve)
    serve.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from semantic.api.app import create_app
    from semantic.api.server import serve
    from semantic.commands import loader, preflight
    from semantic.observability import configure_logging

    settings = settings_from(args)
    # What can fail fails here, before the load: the bind rule, the model's path, the cache
    # folder (locked until the caches are persisted at exit) and the port (bound here).
    with preflight.checked(settings) as checked:
        configure_logging(settings.log_level)
        started = time.perf_counter()
        host = loader.build_host(settings, checked.registry, checked.source)
        app = create_app(host, settings)
        # On SIGTERM/SIGINT: drain (503 to new requests, running ones get
        # shutdown_timeout_s), persist every hot cache, exit 0.
        serve(app, settings, checked.listener, _ready_line(checked, host, started))
    _exit_at_once()
    return 0


def _exit_at_once() -> None:
    """End the process now that the drain is over, every cache is persisted and the cache
    folder is unlocked, without the interpreter's teardown: MLX's C++ runtime can abort in it
    ("terminate called without an active exception", SIGABRT) after a clean stop, and there is
    nothing left for it to do but flush what was logged."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _ready_line(checked: Checked, host: EngineHost, started: float) -> str:
    from semantic.engine.engine import Engine

    engine = host.engine
    if not isinstance(engine, Engine):
        urls = ", ".join(replica["url"] for replica in engine.state()["replicas"])
        return (
            f"ready on {checked.url} ({time.perf_counter() - started:.1f} s to start) — "
            f"vLLM replicas {urls}; API at {checked.url}/docs"
        )
    runner = engine.runner
    blocks = runner.cache_spec.whole_blocks(runner.num_blocks)  # of every layer
    tokens = blocks * runner.cache_spec.block_tokens
    return (
        f"ready on {checked.url} ({time.perf_counter() - started:.1f} s to load) — "
        f"{blocks:,} KV blocks (~{tokens:,} tokens); API at {checked.url}/docs"
    )
