"""The documentation site: it builds strictly, its pages carry the navigation and rendered
Mermaid diagrams (drawn by a browser that reaches no other host, where Chromium is installed),
it loads nothing from another host, and its settings page lists every setting once, from the
settings object."""

from __future__ import annotations

import functools
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from semantic.settings.reference import settings_markdown
from semantic.settings.settings import Settings
from tests.headless_chromium import offline_dom

ROOT = Path(__file__).parents[2]
SCRIPT = re.compile(r'<script\b[^>]*\bsrc="([^"]+)"')
STYLESHEET = re.compile(r'<link\b[^>]*\brel="stylesheet"[^>]*\bhref="([^"]+)"')
ELSEWHERE = re.compile(r"^(https?:)?//")  # an address on another host


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site, built as `make docs` builds it (strict: any warning fails the build)."""
    pytest.importorskip("mkdocs", reason="the docs extra is not installed")
    from mkdocs.commands.build import build
    from mkdocs.config import load_config

    out = tmp_path_factory.mktemp("site")
    build(load_config(str(ROOT / "mkdocs.yml"), site_dir=str(out), strict=True))
    return out


def test_every_setting_is_one_row_of_the_settings_page() -> None:
    page = settings_markdown()
    for name in Settings.model_fields:
        rows = re.findall(rf"^\| `{name}` \|", page, flags=re.MULTILINE)
        assert len(rows) == 1, name


def test_the_home_page_has_the_navigation(site: Path) -> None:
    home = (site / "index.html").read_text()
    nav = home[home.index('<nav class="md-nav md-nav--primary"') :]
    for title, href in [
        ("Getting started", "getting-started/"),
        ("Your first agent", "first-agent/"),
        ("The cache", "cache/"),
        ("Deployment", "deployment/"),
        ("Settings", "reference/settings/"),
        ("Benchmark history", "benchmark-history/"),
    ]:
        assert f'href="{href}"' in nav, title
        assert title in nav


def test_the_cache_page_renders_its_diagrams_as_mermaid_blocks(site: Path) -> None:
    page = (site / "cache" / "index.html").read_text()
    diagrams = re.findall(r'<pre class="mermaid"><code>(.*?)</code></pre>', page, re.DOTALL)
    assert any(d.lstrip().startswith("flowchart") for d in diagrams)
    assert any(d.lstrip().startswith("sequenceDiagram") for d in diagrams)


def test_the_api_reference_is_drawn_from_the_docstrings(site: Path) -> None:
    page = (site / "reference" / "runner" / "index.html").read_text()
    assert "ModelRunner" in page
    assert "The runner owns the tensors" in page  # from the class's docstring
    settings = (site / "reference" / "settings" / "index.html").read_text()
    assert "SEMANTIC_CACHE_BUDGET_MB" in settings


def test_the_site_loads_its_scripts_and_styles_from_itself(site: Path) -> None:
    pages = list(site.rglob("*.html"))
    assert len(pages) > 10
    for page in pages:
        html = page.read_text()
        outside = [s for s in SCRIPT.findall(html) + STYLESHEET.findall(html) if ELSEWHERE.match(s)]
        assert outside == [], page


def test_every_page_with_a_diagram_brings_its_own_mermaid(site: Path) -> None:
    """Material fetches Mermaid from unpkg.com unless the page has defined `mermaid` first: the
    site carries its own copy, so its diagrams draw offline."""
    pages = [p for p in site.rglob("*.html") if '<pre class="mermaid">' in p.read_text()]
    assert pages
    for page in pages:
        scripts = [s for s in SCRIPT.findall(page.read_text()) if "mermaid" in s]
        assert len(scripts) == 1, page
        mermaid = (page.parent / scripts[0]).resolve()
        assert 'globalThis["mermaid"] =' in mermaid.read_text(), page


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@contextmanager
def served(folder: Path) -> Iterator[str]:
    """`folder` over HTTP on a free loopback port, as `mkdocs serve` would show it."""
    handler = functools.partial(_QuietHandler, directory=str(folder))
    with ThreadingHTTPServer(("127.0.0.1", 0), handler) as server:
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            yield f"http://127.0.0.1:{server.server_address[1]}"
        finally:
            server.shutdown()


@pytest.mark.parametrize(("page", "diagrams"), [("", 1), ("cache/", 2)])
def test_a_browser_with_no_other_host_draws_the_pages_diagrams(
    site: Path, page: str, diagrams: int
) -> None:
    """Material replaces each `<pre class="mermaid">` with the drawn diagram (in a `div` of that
    class) once Mermaid has drawn it: here Mermaid can only be the site's own copy."""
    with served(site) as url:
        dom = offline_dom(f"{url}/{page}")
    assert '<nav class="md-nav md-nav--primary"' in dom
    assert '<pre class="mermaid">' not in dom
    assert dom.count('<div class="mermaid">') == diagrams
