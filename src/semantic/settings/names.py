"""A setting's other names: its command-line flag and its environment variable, and which
known name a mistyped one most likely meant."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def env_name(setting: str) -> str:
    """The environment variable of a setting: `cache_budget_mb` → `SEMANTIC_CACHE_BUDGET_MB`."""
    return f"SEMANTIC_{setting.upper()}"


def flag_name(setting: str) -> str:
    """The command-line flag of a setting: `cache_budget_mb` → `--cache-budget-mb`."""
    return "--" + setting.replace("_", "-")


def did_you_mean(given: Iterable[str], known: Iterable[str]) -> str:
    """`; did you mean port?` for the known names the given ones are likely typos of (`port
    for prot, host for hots` when several are); empty when none is close enough."""
    known = list(known)
    guesses = {name: closest(name, known) for name in given}
    found = [(name, guess) for name, guess in guesses.items() if guess is not None]
    if not found:
        return ""
    if len(guesses) == 1:
        return f"; did you mean {found[0][1]}?"
    return f"; did you mean {', '.join(f'{guess} for {name}' for name, guess in found)}?"


def closest(name: str, known: Iterable[str]) -> str | None:
    """The known name `name` is most likely a typo of, if any is close enough."""
    matches = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    return matches[0] if matches else None
