"""A budget check, not a timed unit test: benchmarks/hostile_text.py runs the worst inputs we
know for each pattern and parser that reads client text, at sizes where a superlinear one takes
minutes (300 repeats of a countdown reminder's start took seconds when the patterns
backtracked; its check size is 50,000), each in its own process with a generous budget."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).parents[2] / "benchmarks" / "hostile_text.py"


def test_budget_hostile_text_costs_time_linear_in_its_size() -> None:
    run = subprocess.run(
        [sys.executable, str(SCRIPT), "--check"], capture_output=True, text=True, timeout=1800
    )
    assert run.returncode == 0, run.stdout + run.stderr
