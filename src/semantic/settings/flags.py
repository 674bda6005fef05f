"""Settings as command-line flags, the parser every `semantic` command uses, and the settings a
command's flags give (`settings_from`).

Each setting is a flag (`--cache-budget-mb`; a list setting's flag may repeat), shown in its
group with its default and its environment variable. A parser takes no abbreviated flag and
answers an unknown one with the flag it most likely meant.
"""

from __future__ import annotations

import argparse
import itertools
import typing
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic.fields import FieldInfo

from semantic.settings.errors import load_settings
from semantic.settings.groups import SETTING_GROUPS
from semantic.settings.names import did_you_mean, env_name, flag_name
from semantic.settings.settings import Settings

# The usage line of a command that takes every setting's flag (`serve`, `config`).
SETTINGS_USAGE = "%(prog)s [--SETTING VALUE ...]"


class Parser(argparse.ArgumentParser):
    """argparse, as a user's tool: `--cache-budget` is an unknown flag (with a guess), not an
    abbreviation of `--cache-budget-mb`; `semantic serv` an unknown command (with a guess);
    each command refuses what it does not take itself."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        kwargs.setdefault("formatter_class", _Formatter)
        super().__init__(*args, **kwargs)

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        # A command (a subparser) refuses its own unknown arguments, so the message shows its
        # usage and guesses among its flags rather than the top-level parser's; an unknown
        # flag first, before argparse takes its value for a positional argument.
        if args is not None and self._subparsers is None:
            given = itertools.takewhile(lambda arg: arg != "--", args)
            unknown = [arg for arg in given if arg.startswith("--") and not self._knows(arg)]
            if unknown:
                self._refuse(unknown)
        parsed, extras = super().parse_known_args(args, namespace)
        if extras:
            self._refuse(extras)
        return parsed, extras

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        # A mistyped command or choice gets the one it most likely meant, as a flag does:
        # `semantic serv` → `did you mean serve?`.
        if action.choices is not None and value not in action.choices:
            known = [str(choice) for choice in action.choices]
            raise argparse.ArgumentError(
                action,
                f"invalid choice: {value!r} (choose from {', '.join(known)})"
                f"{did_you_mean([str(value)], known)}",
            )
        super()._check_value(action, value)

    def _knows(self, flag: str) -> bool:
        return flag.partition("=")[0] in self._option_string_actions

    def _refuse(self, extras: list[str]) -> None:
        flags = [option for option in self._option_string_actions if option.startswith("--")]
        unknown = [given.partition("=")[0] for given in extras if given.startswith("--")]
        self.error(f"unrecognized arguments: {' '.join(extras)}{did_you_mean(unknown, flags)}")


class _Formatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions keep their paragraphs; flag help starts in a column wide enough for most
    flags."""

    def __init__(self, prog: str) -> None:
        super().__init__(prog, max_help_position=34)


def add_settings_flags(
    parser: argparse.ArgumentParser,
    names: Iterable[str] | None = None,
    *,
    title: str | None = None,
    help_for: Mapping[str, str] | None = None,
) -> None:
    """A flag for each setting: every one, in the settings' own groups, or those in `names`, in
    one group `title`. `help_for` replaces a setting's description where a command uses
    it differently (`agents --port`: the server to ask)."""
    help_for = help_for or {}
    if title is not None:  # the command's few settings, in the order given
        group = parser.add_argument_group(title)
        for name in names or Settings.model_fields:
            _add_flag(group, name, help_for.get(name))
        return
    for group_title, members in setting_groups():
        group = parser.add_argument_group(f"{group_title} settings")
        for name in members:
            _add_flag(group, name, help_for.get(name))


def setting_groups() -> Iterator[tuple[str, tuple[str, ...]]]:
    """Each group's title and settings, in `--help`'s order; any setting no group lists comes
    last, under "other"."""
    yield from SETTING_GROUPS.items()
    listed = {name for members in SETTING_GROUPS.values() for name in members}
    others = tuple(name for name in Settings.model_fields if name not in listed)
    if others:
        yield "other", others


def _add_flag(group: argparse._ArgumentGroup, name: str, description: str | None) -> None:
    field = Settings.model_fields[name]
    text = f"{description or field.description} {_default_and_env(name, field)}"
    help_text = text.replace("%", "%%")  # argparse formats help with %
    if field.annotation is bool:
        group.add_argument(
            flag_name(name),
            action=argparse.BooleanOptionalAction,
            default=argparse.SUPPRESS,
            help=help_text,
        )
        return
    choices = _literal_choices(field.annotation)
    group.add_argument(
        flag_name(name),
        action="append" if typing.get_origin(field.annotation) is list else "store",
        default=argparse.SUPPRESS,  # only given flags reach the settings, over the other sources
        choices=choices,
        help=help_text,
        metavar=None if choices else _metavar(name, field.annotation),
    )


def _default_and_env(name: str, field: FieldInfo) -> str:
    """`(default 8000; env SEMANTIC_PORT)`; no default where the description explains it."""
    shown = default_text(field)
    explained = "default" in (field.description or "").lower()
    parts = [f"default {shown}"] if shown is not None and not explained else []
    return f"({'; '.join([*parts, f'env {env_name(name)}'])})"


def default_text(field: FieldInfo) -> str | None:
    """A setting's default as a person writes it (`on`, `30`, `~/.cache/semantic`), or None
    when it has none."""
    value = field.get_default(call_default_factory=True)
    if value is None or value == []:
        return None
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, Path) and value.is_relative_to(Path.home()):
        return f"~/{value.relative_to(Path.home())}"
    return str(value)


def _metavar(name: str, annotation: Any) -> str:
    plain = {arg for arg in typing.get_args(annotation) if arg is not type(None)} or {annotation}
    if Path in plain:
        return "PATH"
    if plain & {int, float}:
        return "N"
    return name.rsplit("_", 1)[-1].upper()


def _literal_choices(annotation: Any) -> list[Any] | None:
    if typing.get_origin(annotation) is typing.Literal:
        return list(typing.get_args(annotation))
    return None


def given_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The settings given on the command line, and only those."""
    return {name: getattr(args, name) for name in Settings.model_fields if hasattr(args, name)}


def settings_from(args: argparse.Namespace) -> Settings:
    """The settings a command's flags give, over the environment, `.env` and the config file."""
    return load_settings(given_settings(args))
