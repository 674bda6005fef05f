"""`semantic config`: every effective setting and where its value came from, secrets masked."""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from typing import Any

from pydantic_core import to_jsonable_python

from semantic.settings.errors import load_settings
from semantic.settings.flags import SETTINGS_USAGE, Parser, add_settings_flags, given_settings
from semantic.settings.settings import Settings, is_secret, value_sources


def add_parser(verbs: argparse._SubParsersAction[Parser]) -> None:
    config = verbs.add_parser(
        "config",
        help="print every effective setting and where it came from (secrets masked)",
        description="Every setting's value with these flags over the environment, .env and "
        "the config file, and where it came from (keys masked).",
        usage=SETTINGS_USAGE,
    )
    config.add_argument("--json", action="store_true", help="print JSON")
    add_settings_flags(config)
    config.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    return show(given_settings(args), as_json=args.json)


def show(flags: Mapping[str, Any], as_json: bool) -> int:
    """Print the settings that `flags` over the environment, `.env` and the config file give."""
    settings = load_settings(flags)
    sources = value_sources(flags)
    shown = {
        name: {**_shown(name, getattr(settings, name)), "source": sources[name]}
        for name in Settings.model_fields
    }
    if as_json:
        print(json.dumps(shown, indent=2))
    else:
        _print_table(shown)
    return 0


def _shown(name: str, value: Any) -> dict[str, Any]:
    """The value, JSON-ready; a secret shows only as `***` and how many there are."""
    if is_secret(name):
        return {"value": "***" if value else None, "count": len(value)}
    return {"value": to_jsonable_python(value)}


def _print_table(shown: dict[str, dict[str, Any]]) -> None:
    texts = {name: _text(row) for name, row in shown.items()}
    name_width = max(len(name) for name in shown)
    value_width = min(40, max(len(text) for text in texts.values()))
    print(f"{'setting':<{name_width}}  {'value':<{value_width}}  source")
    for name, row in shown.items():
        print(f"{name:<{name_width}}  {texts[name]:<{value_width}}  {row['source']}")


def _text(row: dict[str, Any]) -> str:
    if "count" in row:
        count = row["count"]
        return f"*** ({count} key{'' if count == 1 else 's'})" if count else "(none)"
    return json.dumps(row["value"])
