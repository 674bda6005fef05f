"""A mkdocs hook: the site's settings page, generated from the settings object.

Every setting appears once, in the groups `semantic serve --help` shows, with its flag, its
environment variable, its default and its description, all read from the `semantic.settings`
package, so the page cannot drift from the code.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files

# The checkout's own sources, before any installed copy of the package.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from semantic.settings.reference import settings_markdown

PAGE = "reference/settings.md"


def on_files(files: Files, config: MkDocsConfig, **_: Any) -> Files:
    """Add the settings page to the site's files."""
    files.append(File.generated(config, PAGE, content=settings_markdown()))
    return files
