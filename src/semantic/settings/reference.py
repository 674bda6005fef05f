"""Every setting as a Markdown reference: the documentation site's settings page.

Read from the settings object itself (groups, descriptions, defaults, flags, environment
variables), so the page is never copied by hand and never out of date.
"""

from __future__ import annotations

import html

from semantic.settings.flags import default_text, setting_groups
from semantic.settings.names import env_name, flag_name
from semantic.settings.settings import Settings

INTRODUCTION = """\
# Settings

Every setting of `semantic serve`, generated from the settings object
(`semantic.settings.settings.Settings`). Each one can be given five ways; the first that sets a
value wins:

1. a command-line flag: `--cache-budget-mb 1024`
2. an environment variable: `SEMANTIC_CACHE_BUDGET_MB=1024`
3. the same variable in your `.env` file (`$XDG_CONFIG_HOME/semantic/.env`, else
   `~/.config/semantic/.env`)
4. a TOML config file named by `--config PATH` or `SEMANTIC_CONFIG` (flat `name = value` pairs)
5. the default

`semantic config` prints the effective value of each and where it came from;
`semantic serve --help` lists the same settings in the same groups.
"""


def settings_markdown() -> str:
    """The whole page: an introduction, then a table of each group's settings."""
    sections = [INTRODUCTION]
    for title, names in setting_groups():
        rows = "\n".join(_row(name) for name in names)
        sections.append(
            f"## {title.capitalize()}\n\n"
            "| setting | flag, environment | default | what it does |\n"
            "|---|---|---|---|\n"
            f"{rows}\n"
        )
    return "\n".join(sections)


def _row(name: str) -> str:
    field = Settings.model_fields[name]
    default = default_text(field)
    cells = [
        f"`{name}`",
        f"`{flag_name(name)}`<br>`{env_name(name)}`",
        f"`{default}`" if default is not None else "—",
        _cell(field.description or ""),
    ]
    return f"| {' | '.join(cells)} |"


def _cell(text: str) -> str:
    """Text safe inside a Markdown table cell: no HTML, no column breaks, one line."""
    return html.escape(text, quote=False).replace("|", "\\|").replace("\n", " ")
