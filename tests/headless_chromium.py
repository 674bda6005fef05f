"""Pages as a browser draws them with every other host out of reach: Debian's headless Chromium,
its proxy a closed port (loopback never goes through a proxy), returning the DOM once the
page's scripts have run. Tests that use it skip where Chromium is not installed."""

from __future__ import annotations

import shutil
import subprocess

import pytest

UNREACHABLE_PROXY = "127.0.0.1:9"  # the discard port: nothing listens, so any other host fails


def offline_dom(url: str) -> str:
    """The DOM of `url` after its scripts ran (10 s of the page's virtual time)."""
    browser = shutil.which("chromium")
    if browser is None:
        pytest.skip("Debian's chromium is not installed (apt-get install chromium)")
    drawn = subprocess.run(
        [
            browser,
            "--headless",
            "--no-sandbox",  # as root, in a container
            "--disable-gpu",
            f"--proxy-server={UNREACHABLE_PROXY}",
            "--virtual-time-budget=10000",
            "--dump-dom",
            url,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return drawn.stdout
