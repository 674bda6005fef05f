"""The `semantic` command, and the only wiring: settings → model → runner → engine → app.

Every `Settings` field is a flag here (`--cache-budget-mb`; a list field's flag may repeat); only
flags given on the command line are passed on, so the environment, `.env` and the TOML file still
apply beneath them.
"""

from __future__ import annotations

import argparse
import logging
import sys
import threading
import typing
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError
from pydantic_settings import SettingsError

from semantic import __version__
from semantic.config import Settings
from semantic.errors import SemanticError

if TYPE_CHECKING:
    from semantic.engine.engine import Engine
    from semantic.engine.host import EngineHost
    from semantic.registry import ModelSource

log = logging.getLogger("semantic")


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args))
    except (SemanticError, ValidationError, SettingsError) as exc:
        print(f"semantic: {exc}", file=sys.stderr)
        return 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="semantic", description=__doc__)
    parser.add_argument("--version", action="version", version=f"semantic {__version__}")
    verbs = parser.add_subparsers(dest="verb", required=True)

    serve = verbs.add_parser("serve", help="start the HTTP server")
    _add_settings_flags(serve)
    serve.set_defaults(handler=_serve)

    config = verbs.add_parser(
        "config", help="print every effective setting and where it came from (secrets masked)"
    )
    config.add_argument("--json", action="store_true", help="print JSON")
    _add_settings_flags(config)
    config.set_defaults(handler=_config)

    models = verbs.add_parser("models", help="list the models that can be served")
    _add_settings_flags(models)
    models.set_defaults(handler=_models)

    agents = verbs.add_parser(
        "agents",
        help="list, inspect or delete agents and their caches",
        description="Asks the running server (--host/--port); without one, reads the cache "
        "directory (--cache-dir) directly.",
    )
    agents.add_argument("action", nargs="?", default="list", choices=["list", "show", "delete"])
    agents.add_argument("agent_id", nargs="?", help="the agent, for show and delete")
    _add_settings_flags(agents)
    agents.set_defaults(handler=_agents)

    bench = verbs.add_parser("bench", help="benchmark an OpenAI-compatible server")
    from semantic.bench.cli import add_bench_arguments

    add_bench_arguments(bench)
    bench.set_defaults(handler=_bench)
    return parser


def _add_settings_flags(parser: argparse.ArgumentParser) -> None:
    for name, field in Settings.model_fields.items():
        flag = "--" + name.replace("_", "-")
        help_text = field.description
        if field.annotation is bool:
            parser.add_argument(
                flag,
                action=argparse.BooleanOptionalAction,
                default=argparse.SUPPRESS,
                help=help_text,
            )
            continue
        choices = _literal_choices(field.annotation)
        parser.add_argument(
            flag,
            action="append" if typing.get_origin(field.annotation) is list else "store",
            default=argparse.SUPPRESS,
            choices=choices,
            help=help_text,
            metavar=None if choices else name.upper(),
        )


def _literal_choices(annotation: Any) -> list[Any] | None:
    if typing.get_origin(annotation) is typing.Literal:
        return list(typing.get_args(annotation))
    return None


def settings_from(args: argparse.Namespace) -> Settings:
    return Settings(**_flags(args))


def _flags(args: argparse.Namespace) -> dict[str, Any]:
    """The settings given on the command line, and only those."""
    return {name: getattr(args, name) for name in Settings.model_fields if hasattr(args, name)}


def _config(args: argparse.Namespace) -> int:
    from semantic import config_command

    return config_command.run(_flags(args), as_json=args.json)


def _models(args: argparse.Namespace) -> int:
    from semantic.models.checkpoint import template_origin
    from semantic.registry import ModelRegistry

    settings = settings_from(args)
    registry = ModelRegistry.from_settings(settings)
    for source in registry.available():
        marker = "*" if source.name == registry.resolve(settings.model).name else " "
        template = f"template: {template_origin(source.path)}"
        print(f"{marker} {source.name:<20} {source.format:<5} {template:<26} {source.path}")
    return 0


def _agents(args: argparse.Namespace) -> int:
    from semantic import agents_command

    settings = settings_from(args)
    if args.action != "list" and not args.agent_id:
        raise SemanticError(f"`semantic agents {args.action}` needs an agent id")
    return agents_command.run(settings, args.action, args.agent_id)


def _bench(args: argparse.Namespace) -> int:
    from semantic.bench.cli import options_from_args
    from semantic.bench.run import run_bench

    run_bench(options_from_args(args))
    return 0


def _serve(args: argparse.Namespace) -> int:
    from semantic.api.app import create_app
    from semantic.api.server import serve
    from semantic.cache.disk import cache_root
    from semantic.cache.folder_lock import FolderLock
    from semantic.observability import configure_logging

    settings = settings_from(args)
    check_bind(settings)
    configure_logging(settings.log_level)
    # One server per cache folder, refused before the model loads so that a second one fails
    # at once; held until the caches are persisted at exit.
    with FolderLock.acquire(cache_root(settings.cache_dir)):
        app = create_app(build_host(settings), settings)
        # On SIGTERM/SIGINT: drain (503 to new requests, running ones get
        # shutdown_timeout_s), persist every hot cache, exit 0.
        serve(app, settings)
    return 0


def check_bind(settings: Settings) -> None:
    """Loopback by default: serving other machines takes `--allow-remote` and an API key, so a
    server is never reachable from the network without a key by accident."""
    if settings.is_loopback:
        return
    how_to_key = "--api-key, SEMANTIC_API_KEY, --api-key-file or --admin-api-key"
    if not settings.allow_remote:
        raise SemanticError(
            f"refusing to bind {settings.host!r}: it is not a loopback address; serving other "
            f"machines needs --allow-remote and an API key ({how_to_key})"
        )
    if not settings.any_api_keys:
        raise SemanticError(
            f"refusing to bind {settings.host!r} without an API key: set one with {how_to_key}"
        )


def build_host(settings: Settings) -> EngineHost:
    """The configured model's engine, in a host that can swap it for another model (each load
    on a short-lived thread, as the first)."""
    from semantic.engine.host import EngineHost
    from semantic.registry import ModelRegistry

    registry = ModelRegistry.from_settings(settings)
    source = registry.resolve(settings.model)

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
    from semantic.backends import create_runner
    from semantic.engine.engine import Engine
    from semantic.memory import own_mappings
    from semantic.models.checkpoint import load_checkpoint
    from semantic.models.served import ServedModel
    from semantic.options import engine_options, runner_options
    from semantic.registry import ModelRegistry

    source = source or ModelRegistry.from_settings(settings).resolve(settings.model)
    log.info("loading %s from %s", source.name, source.path)
    # In mappings of their own, the weights and the pool go back to the system on a swap.
    with own_mappings():
        checkpoint = load_checkpoint(source.path, progress=sys.stderr.isatty())
        runner = create_runner(runner_options(settings), checkpoint.config, checkpoint.weights())
    context = checkpoint.config.max_position_embeddings
    served = ServedModel(
        name=_served_name(settings, source),
        config=checkpoint.config,
        tokenizer=checkpoint.tokenizer,
        chat_template=checkpoint.chat_template,
        context_length=min(context, settings.max_model_len or context),
        weights_fingerprint=checkpoint.fingerprint,
        aliases=(source.name, *source.aliases),
    )
    spec = runner.cache_spec
    log.info(
        "KV pool: %d blocks of %d tokens, %s tokens in %d MiB (%s; %s)",
        runner.num_blocks,
        spec.block_tokens,
        f"{runner.num_blocks * spec.block_tokens:,}",
        runner.num_blocks * spec.bytes_per_block // 2**20,
        spec.tag(),
        "cache_budget_mb" if settings.cache_budget_mb else "sized from the free memory",
    )
    return Engine(runner, served, engine_options(settings))


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
