"""benchmarks/agent_tasks.py: a CLI turn that runs past its limit is killed and recorded as failed,
and the run goes on."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tests.benchmark_script import load_benchmark

agent_tasks = load_benchmark("agent_tasks")


def test_a_turn_past_its_limit_is_killed_and_counts_as_failed(tmp_path: Path) -> None:
    slow = [sys.executable, "-c", "print('started', flush=True); import time; time.sleep(30)"]
    limit = argparse.Namespace(turn_timeout=2.0)
    exit_code, output = agent_tasks._cli_turn(slow, tmp_path, {}, limit)
    assert exit_code == -1
    assert output.endswith("[killed after 2 s]")


def test_a_turn_in_time_gives_its_exit_code_and_output(tmp_path: Path) -> None:
    quick = [sys.executable, "-c", "print(' done ')"]
    limit = argparse.Namespace(turn_timeout=30.0)
    assert agent_tasks._cli_turn(quick, tmp_path, {}, limit) == (0, "done")
