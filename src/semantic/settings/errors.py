"""Settings errors as a person reads them: each names the setting, where its value came from
(a flag, an environment variable, `.env`, the config file) and what it must be, in place of the
validation library's report."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError
from pydantic_core import ErrorDetails
from pydantic_settings import SettingsError

from semantic.errors import InvalidSettings
from semantic.settings.names import did_you_mean, env_name, flag_name
from semantic.settings.settings import Settings, is_secret, value_sources

# What a value must be, by the validation error's type; `{…}` are the error's context.
_MUST_BE = {
    "int_parsing": "a whole number",
    "int_type": "a whole number",
    "int_from_float": "a whole number",
    "float_parsing": "a number",
    "float_type": "a number",
    "bool_parsing": "true or false",
    "bool_type": "true or false",
    "string_type": "text",
    "path_type": "a path",
    "list_type": "a list",
    "literal_error": "{expected}",
    "greater_than_equal": "at least {ge}",
    "greater_than": "more than {gt}",
    "less_than_equal": "at most {le}",
    "less_than": "less than {lt}",
}


def load_settings(flags: Mapping[str, Any]) -> Settings:
    """The settings that `flags` give over the environment, `.env` and the config file, or
    InvalidSettings saying which value is wrong, where it came from and what it must be."""
    try:
        return Settings(**flags)
    except ValidationError as exc:
        raise InvalidSettings(explain(exc, flags)) from None
    except SettingsError as exc:  # the config file: missing, not TOML, unknown names
        raise InvalidSettings(str(exc)) from None


def unknown_variables(environ: Mapping[str, str]) -> list[str]:
    """A warning for each `SEMANTIC_*` variable that names no setting, which the settings
    ignore (a typo would leave the default in force unseen), with the one it likely meant."""
    known = {env_name(name) for name in Settings.model_fields}
    ours = (name for name in environ if name.upper().startswith("SEMANTIC_"))
    return [
        f"{name} names no setting and is ignored{did_you_mean([name.upper()], known)}"
        for name in sorted(name for name in ours if name.upper() not in known)
    ]


def explain(exc: ValidationError, flags: Mapping[str, Any]) -> str:
    """One line per wrong value: `SEMANTIC_CACHE_BUDGET_MB=abc (environment variable):
    cache_budget_mb must be a whole number`."""
    sources = value_sources(flags)
    lines = (_line(error, sources) for error in exc.errors())
    return "\n".join(dict.fromkeys(lines))


def _line(error: ErrorDetails, sources: Mapping[str, str]) -> str:
    loc = error.get("loc", ())
    name = str(loc[0]) if loc else None
    if name not in Settings.model_fields:  # a check across settings: its message says which
        return _reason(error)
    assert name is not None
    shown = "***" if is_secret(name) else _shown(error.get("input"))
    template = _MUST_BE.get(error["type"])
    what = _reason(error) if template is None else f"{name} must be {template}"
    return f"{_where(name, shown, sources[name])}: {what.format(**error.get('ctx', {}))}"


def _reason(error: ErrorDetails) -> str:
    """Our own checks' messages, which say what is wrong themselves."""
    return str(error.get("msg", "not valid")).removeprefix("Value error, ")


def _where(name: str, shown: str, source: str) -> str:
    if source == "flag":
        return f"{flag_name(name)} {shown}"
    if source == "env":
        return f"{env_name(name)}={shown} (environment variable)"
    if source == ".env":
        return f"{env_name(name)}={shown} in .env"
    if source == "default":
        return f"{name} (its default)"
    return f"{name} = {shown} in {source}"  # the config file


def _shown(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text if len(text) <= 60 else text[:57] + "..."
