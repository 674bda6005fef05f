"""Hostile text costs work linear in its size: benchmarks/hostile_text.py runs the worst inputs we
know for each pattern and parser that reads client text at a size n and at 4n, and compares the
CPU time of the thread that ran them (the least of three runs, in turns, the collector held
off). Linear work grows about 4×, quadratic 16×; the check fails above 8×. No bound on seconds:
a slow or loaded machine passes, a superlinear pattern fails on any machine (300 repeats of a
countdown reminder's start took seconds when the patterns backtracked; these sizes hold tens of
thousands, so such a pattern also fails the child's hang guard). Each case runs in a process of
its own, since a regex cannot be interrupted from the thread that runs it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tests.benchmark_script import load_benchmark

hostile_text = load_benchmark("hostile_text")


@pytest.mark.parametrize("case", hostile_text.CASES, ids=lambda case: case.name)
def test_hostile_text_costs_work_linear_in_its_size(case: Any) -> None:
    assert hostile_text.check_one(case) is None


def test_the_growth_check_fails_a_quadratic_case() -> None:
    """The check can fail: a case that does n² steps of work for input n grows 16× from n to 4n."""
    steps = hostile_text.Case("quadratic", "n² additions", _quadratic, (300, 600, 1200))
    assert hostile_text.growth(steps) > hostile_text.MAX_GROWTH
    linear = hostile_text.Case("linear", "n additions", _linear, (90_000, 180_000, 360_000))
    assert hostile_text.growth(linear) <= hostile_text.MAX_GROWTH


def _quadratic(n: int) -> Callable[[], int]:
    return lambda: sum(i ^ j for i in range(n) for j in range(n))


def _linear(n: int) -> Callable[[], int]:
    return lambda: sum(i ^ 7 for i in range(n))
