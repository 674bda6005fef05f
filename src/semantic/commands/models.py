"""`semantic models`: the models that can be served, the configured one marked."""

from __future__ import annotations

import argparse

from semantic.settings.flags import Parser, add_settings_flags, settings_from


def add_parser(verbs: argparse._SubParsersAction[Parser]) -> None:
    models = verbs.add_parser(
        "models",
        help="list the models that can be served",
        description="The models that can be served: the built-in ones installed, and "
        "model_alias entries; * marks the configured one.",
    )
    add_settings_flags(models, ["config", "model", "model_alias"], title="which models")
    models.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from semantic.models.checkpoint import template_origin
    from semantic.models.registry import ModelRegistry

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
