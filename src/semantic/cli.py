"""The `semantic` command: settings → model → runner → engine (`engine/wiring.py` builds its
parts) → app.

Each command takes its own flags: `serve` and `config` every setting's (settings_flags.py),
`models` and `agents` the few they use. Only flags given on the command line are passed on, so
the environment, `.env` and the TOML file still apply beneath them.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

import numpy as np

from semantic import __version__
from semantic.config import Settings
from semantic.config_errors import load_settings, unknown_variables
from semantic.errors import SemanticError
from semantic.settings_flags import Parser, add_settings_flags, given_settings

if TYPE_CHECKING:
    from semantic.core import DefaultSampling
    from semantic.engine.engine import Engine
    from semantic.engine.host import EngineHost
    from semantic.models.checkpoint import Checkpoint
    from semantic.models.config import ModelConfig
    from semantic.models.q6k import Blocks
    from semantic.models.served import ServedModel
    from semantic.preflight import Checked
    from semantic.registry import ModelRegistry, ModelSource
    from semantic.replicas.engine import ReplicaEngine

log = logging.getLogger("semantic")

_ABOUT = """\
semantic: a local inference server for many LLM agents at once. Each agent's KV cache stays
between its turns, in memory or on disk, across restarts; clients speak the OpenAI or the
Anthropic API, or the direct agent API.

Start with `semantic serve` (http://127.0.0.1:8000, the built-in SmolLM2 model), then open
http://127.0.0.1:8000/docs for the API. Settings come from flags, SEMANTIC_* environment
variables, .env and a TOML file (--config): `semantic config` shows each one and where it came
from."""

_SERVE_ABOUT = """\
Load the model, then serve the OpenAI, Anthropic and agent APIs (http://127.0.0.1:8000 by
default; the API's own documentation at /docs). Everything that can fail before the load (the
port, the cache folder, the model's path, the settings) is checked first.

Each setting below is a flag, an environment variable (shown) and a key of the TOML file that
--config names; a flag wins over the environment, .env and the file."""

_WITH_SETTINGS = "%(prog)s [--SETTING VALUE ...]"

_AGENTS_ABOUT = """\
list (the default): every agent, its cached tokens in memory and on disk, pinned or not, when
it was last used and how many turns it had; show ID: one agent in full; delete ID: an agent and
the cache no other agent shares.

Asks the running server at --host and --port (or --url), with its admin key, else its API key:
a key sees its own agents, an admin key every key's (--owner names whose). A key goes only to a
loopback host or to --url, and over plain http only to loopback unless --allow-plain-http. When
no server answers, reads the cache folder (--cache-dir) directly, every owner's agents, and
says so."""


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


def _parser() -> argparse.ArgumentParser:
    parser = Parser(prog="semantic", description=_ABOUT)
    parser.add_argument("--version", action="version", version=f"semantic {__version__}")
    verbs = parser.add_subparsers(
        dest="verb", title="commands", metavar="COMMAND", parser_class=Parser
    )

    serve = verbs.add_parser(
        "serve", help="start the HTTP server", description=_SERVE_ABOUT, usage=_WITH_SETTINGS
    )
    add_settings_flags(serve)
    serve.set_defaults(handler=_serve)

    config = verbs.add_parser(
        "config",
        help="print every effective setting and where it came from (secrets masked)",
        description="Every setting's value with these flags over the environment, .env and "
        "the config file, and where it came from (keys masked).",
        usage=_WITH_SETTINGS,
    )
    config.add_argument("--json", action="store_true", help="print JSON")
    add_settings_flags(config)
    config.set_defaults(handler=_config)

    models = verbs.add_parser(
        "models",
        help="list the models that can be served",
        description="The models that can be served: the built-in ones installed, and "
        "model_alias entries; * marks the configured one.",
    )
    add_settings_flags(models, ["config", "model", "model_alias"], title="which models")
    models.set_defaults(handler=_models)

    agents = verbs.add_parser(
        "agents", help="list, inspect or delete agents and their caches", description=_AGENTS_ABOUT
    )
    agents.add_argument(
        "action",
        nargs="?",
        default="list",
        choices=["list", "show", "delete"],
        help="what to do (default: list)",
    )
    agents.add_argument("agent_id", nargs="?", help="the agent, for show and delete")
    agents.add_argument("--json", action="store_true", help="print JSON")
    agents.add_argument(
        "--owner",
        help="whose agents: an owner from the list (the digest of a key), or `none` for "
        "agents of no key; by default, with an admin key every key's to list and its own to "
        "show or delete",
    )
    agents.add_argument(
        "--url",
        help="the server to ask, as http(s)://host:port; without it, the settings' host and "
        "port, where an API key is sent only if the host is loopback",
    )
    agents.add_argument(
        "--allow-plain-http",
        action="store_true",
        help="send the API key over plain http to a --url off this machine",
    )
    add_settings_flags(
        agents,
        ["host", "port", "api_key", "api_key_file", "admin_api_key", "cache_dir", "config"],
        title="the server to ask, else the cache folder to read",
        help_for={
            "host": "Host of the running server to ask.",
            "port": "Port of the running server to ask.",
            "api_key": "API key to send to the server when no admin key is set.",
            "api_key_file": "File of API keys; the first is sent when no admin key is set.",
            "admin_api_key": "Admin key to send (it sees every key's agents).",
        },
    )
    agents.set_defaults(handler=_agents)

    bench = verbs.add_parser("bench", help="benchmark an OpenAI-compatible server")
    from semantic.bench.cli import add_bench_arguments

    add_bench_arguments(bench)
    bench.set_defaults(handler=_bench)
    return parser


def settings_from(args: argparse.Namespace) -> Settings:
    return load_settings(given_settings(args))


def _config(args: argparse.Namespace) -> int:
    from semantic import config_command

    return config_command.run(given_settings(args), as_json=args.json)


def _models(args: argparse.Namespace) -> int:
    from semantic.models.checkpoint import template_origin
    from semantic.registry import ModelRegistry

    settings = settings_from(args)
    registry = ModelRegistry.from_settings(settings)
    configured = registry.resolve(settings.model, join=False).name
    for source in registry.available():
        marker = "*" if source.name == configured else " "
        # A model in pieces not joined yet: its first load joins it (a listing never writes).
        origin = template_origin(source.path) if source.path.exists() else "not joined yet"
        template = f"template: {origin}"
        print(f"{marker} {source.name:<20} {source.format:<5} {template:<26} {source.path}")
    return 0


def _agents(args: argparse.Namespace) -> int:
    from semantic import agents_command

    settings = settings_from(args)
    if args.action != "list" and not args.agent_id:
        raise SemanticError(f"`semantic agents {args.action}` needs an agent id")
    query = agents_command.Query(
        args.action, args.agent_id, args.owner, args.json, args.url, args.allow_plain_http
    )
    return agents_command.run(settings, query)


def _bench(args: argparse.Namespace) -> int:
    from semantic.bench.cli import options_from_args
    from semantic.bench.run import run_bench

    run_bench(options_from_args(args))
    return 0


def _serve(args: argparse.Namespace) -> int:
    from semantic import preflight
    from semantic.api.app import create_app
    from semantic.api.server import serve
    from semantic.observability import configure_logging

    settings = settings_from(args)
    # What can fail fails here, before the load: the bind rule, the model's path, the cache
    # folder (locked until the caches are persisted at exit) and the port (bound here).
    with preflight.checked(settings) as checked:
        configure_logging(settings.log_level)
        started = time.perf_counter()
        host = build_host(settings, checked.registry, checked.source)
        app = create_app(host, settings)
        # On SIGTERM/SIGINT: drain (503 to new requests, running ones get
        # shutdown_timeout_s), persist every hot cache, exit 0.
        serve(app, settings, checked.listener, _ready_line(checked, host, started))
    return 0


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


def build_host(
    settings: Settings,
    registry: ModelRegistry | None = None,
    source: ModelSource | None = None,
) -> EngineHost:
    """The configured model's engine (`source` of `registry`, when found already), in a host
    that can swap it for another model (each load on a short-lived thread, as the first)."""
    from semantic.engine.host import EngineHost
    from semantic.registry import ModelRegistry

    registry = registry or ModelRegistry.from_settings(settings)
    source = source or registry.resolve(settings.model)
    if settings.engine == "vllm":
        engine = build_replica_engine(settings, source)
        return EngineHost(engine, settings, source=source, registry=registry)

    def load(source: ModelSource) -> Engine:
        return _build_engine_off_the_main_thread(settings, source)

    return EngineHost(load(source), settings, source=source, registry=registry, load=load)


def _build_engine_off_the_main_thread(settings: Settings, source: ModelSource) -> Engine:
    """`build_engine` on a short-lived thread. When the main thread, which goes on to run the
    event loop, did the load's torch work, every step on the engine thread ran at about half
    speed (SmolLM2 single-stream decode 53 vs 93 tok/s on 2 cores; see docs/design.md). A
    daemon, so Ctrl-C during a load exits at once."""
    built: list[Engine] = []
    failed: list[BaseException] = []

    def load() -> None:
        try:
            built.append(build_engine(settings, source))
        except BaseException as exc:
            failed.append(exc)

    loader = threading.Thread(target=load, name="semantic-load", daemon=True)
    loader.start()
    loader.join()
    if failed:
        raise failed[0]
    return built[0]


def build_engine(settings: Settings, source: ModelSource | None = None) -> Engine:
    """Load the model (`source`, else the configured one), build its runner over a fresh block
    pool, wrap an engine."""
    from semantic.backends import create_runner, with_weights
    from semantic.engine import wiring
    from semantic.kv_budget import short_pool_warning
    from semantic.memory import own_mappings
    from semantic.models.checkpoint import load_checkpoint
    from semantic.options import engine_options, runner_options
    from semantic.registry import ModelRegistry

    source = source or ModelRegistry.from_settings(settings).resolve(settings.model)
    log.info("loading %s from %s", source.name, source.path)
    started = time.perf_counter()
    # In mappings of their own, the weights and the pool go back to the system on a swap.
    with own_mappings():
        checkpoint = load_checkpoint(source.path, progress=sys.stderr.isatty())
        log.info("read the config and tokenizer in %.1f s", time.perf_counter() - started)
        context = checkpoint.config.max_position_embeddings
        context = min(context, settings.max_model_len or context)
        config = checkpoint.config.within_context(context)  # LongRoPE's factors for it
        options, tensors = with_weights(runner_options(settings), checkpoint)
        weights = _logged_weights(tensors)
        runner = create_runner(options, config, weights, checkpoint.fingerprint)
    served = _served_model(settings, source, checkpoint, config, context)
    spec = runner.cache_spec
    log.info(
        "KV pool: %d pages of %d tokens × %d layers, %s tokens of every layer in %d MiB (%s; %s)",
        runner.num_blocks,
        spec.block_tokens,
        spec.layers_per_group,
        f"{spec.whole_blocks(runner.num_blocks) * spec.block_tokens:,}",
        runner.num_blocks * spec.bytes_per_page // 2**20,
        spec.tag(),
        "cache_budget_mb" if settings.cache_budget_mb else "sized from the free memory",
    )
    engine = wiring.build_engine(runner, served, engine_options(settings))
    short = short_pool_warning(
        engine.max_seq_tokens, context, spec.block_tokens, spec.bytes_per_block
    )
    if short is not None:
        log.warning(short)
    log.info("loaded %s in %.1f s", source.name, time.perf_counter() - started)
    return engine


def build_replica_engine(settings: Settings, source: ModelSource) -> ReplicaEngine:
    """The engine over the vLLM replicas at `vllm_url`: `source`'s tokenizer and chat template
    render the prompts (its weights are not read; the replicas serve the same model)."""
    from semantic.models.checkpoint import load_checkpoint
    from semantic.replicas.engine import ReplicaEngine
    from semantic.replicas.router import Router
    from semantic.server_key import ServerKey

    checkpoint = load_checkpoint(source.path, progress=False)
    context = checkpoint.config.max_position_embeddings
    context = min(context, settings.max_model_len or context)
    config = checkpoint.config.within_context(context)
    served = _served_model(settings, source, checkpoint, config, context)
    log.info("vLLM replicas %s serve %s", ", ".join(settings.vllm_url), served.name)
    return ReplicaEngine(
        served,
        Router(settings.vllm_url, settings.vllm_spill_in_flight),
        ServerKey(settings.cache_dir),
        share_across_keys=settings.share_cache_across_keys,
        health_interval_s=settings.vllm_health_interval_s,
    )


def _served_model(
    settings: Settings,
    source: ModelSource,
    checkpoint: Checkpoint,
    config: ModelConfig,
    context: int,
) -> ServedModel:
    """What the API sees of the model: its names, tokenizer, template and default sampling."""
    from semantic.models.served import ServedModel

    hint = (
        source.tool_result_hint if settings.tool_result_hint is None else settings.tool_result_hint
    )
    checkpoint.chat_template.tool_result_hint = hint
    if hint:
        log.info("each run of tool results ends with the hint %r", hint)
    return ServedModel(
        name=_served_name(settings, source),
        config=config,
        tokenizer=checkpoint.tokenizer,
        chat_template=checkpoint.chat_template,
        context_length=context,
        weights_fingerprint=checkpoint.fingerprint,
        aliases=(source.name, *source.aliases),
        sampling=_default_sampling(settings, checkpoint.sampling or source.sampling),
    )


def _default_sampling(settings: Settings, recommended: DefaultSampling | None) -> DefaultSampling:
    """What requests that leave sampling out get; the choice is logged, since it changes
    every answer of clients that send no temperature (Claude Code, Codex)."""
    from semantic.core import PROTOCOL_SAMPLING

    chosen = recommended if settings.model_sampling and recommended else PROTOCOL_SAMPLING
    log.info(
        "sampling a request leaves out: temperature %g, top_p %g, top_k %d, repetition "
        "penalty %g (%s)",
        chosen.temperature,
        chosen.top_p,
        chosen.top_k,
        chosen.repetition_penalty,
        "the model's recommendation" if chosen is recommended else "the protocols' defaults",
    )
    return chosen


def _logged_weights(
    tensors: Iterator[tuple[str, np.ndarray | Blocks]],
) -> Iterator[tuple[str, np.ndarray | Blocks]]:
    """The weights, unchanged; once the backend has taken the last, a log line of how many and
    how long (the terminal's progress bar aside, the one sign of this phase in a log)."""
    started, count = time.perf_counter(), 0
    for tensor in tensors:
        count += 1
        yield tensor
    log.info(
        "weights: %d tensors read and converted in %.1f s", count, time.perf_counter() - started
    )


def _served_name(settings: Settings, source: ModelSource) -> str:
    """The id clients see: `served_model_name` for the configured model, whenever it is loaded
    (the name tags its caches on disk), and a swapped-in model's own name."""
    from semantic.registry import ModelRegistry

    if settings.served_model_name is None:
        return source.name
    try:
        configured = ModelRegistry.from_settings(settings).resolve(settings.model)
    except SemanticError:
        return source.name
    same = configured.path.resolve() == source.path.resolve()
    return settings.served_model_name if same else source.name
