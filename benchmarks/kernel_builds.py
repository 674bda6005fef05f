"""Builds of our CPU kernels compared: each a `semantic_cpu_kernels.so` (e.g. one from before a
change and one from after it: the path `cpu_kernels()._module.__file__` names). Every round runs
a benchmark script once with each library in a process of its own, in turn, and the table gives
each one's median of the rounds. One process cannot hold two: Python's second load of an
extension of the same name returns the first."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path


def compare(
    script: str, libraries: list[str], forwarded: list[str], rounds: int, unit: str
) -> None:
    """`script` run with `forwarded`, `--json` and `--library` each library, `rounds` times in
    turn; it prints one JSON object of figures by case as its last line."""
    cells: dict[str, dict[str, list[float]]] = {library: {} for library in libraries}
    for _ in range(rounds):
        for library in libraries:
            command = [sys.executable, script, *forwarded, "--json", "--library", library]
            out = subprocess.run(command, capture_output=True, text=True, check=True)
            for case, figure in json.loads(out.stdout.splitlines()[-1]).items():
                cells[library].setdefault(case, []).append(figure)
    print(f"median {unit} of {rounds} rounds, each library in a process of its own, in turn")
    print("| case | " + " | ".join(Path(library).name for library in libraries) + " |")
    print("|---" * (len(libraries) + 1) + "|")
    for case in cells[libraries[0]]:
        medians = [statistics.median(cells[library][case]) for library in libraries]
        print(f"| {case} | " + " | ".join(f"{figure:.3f}" for figure in medians) + " |")
