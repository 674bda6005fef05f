"""docs/failure_modes.md maps each failure mode to the tests that show it: every test it names
must exist, and every numbered failure mode must have a row with at least one test."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).parents[2]
DOC = ROOT / "docs" / "failure_modes.md"


def test_every_test_the_failure_mode_table_names_exists() -> None:
    named = re.findall(r"`(tests/[\w/]+\.py)::(test_\w+)`", DOC.read_text())
    assert len(named) > 30
    missing = [
        f"{path}::{test}"
        for path, test in named
        if not re.search(rf"^def {test}\(", (ROOT / path).read_text(), re.MULTILINE)
    ]
    assert missing == []


def test_every_spec_failure_mode_has_a_row_with_tests() -> None:
    """Each of the fourteen failure modes has its row, in order, with tests."""
    rows = [line for line in DOC.read_text().splitlines() if re.match(r"\| \d+ \|", line)]
    numbers = [int(row.split("|")[1]) for row in rows]
    assert numbers == list(range(1, 15))
    assert all("::test_" in row for row in rows)
