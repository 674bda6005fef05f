"""The torch backend computes with the cores other programs leave free, read from the load."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from semantic.backends.torch import threads
from semantic.backends.torch.threads import CpuTimes, ThreadGovernor, read_cpu_times


class Clock:
    """Readings as the governor takes them: the others' and our CPU seconds at a time."""

    def __init__(self) -> None:
        self.now = 100.0
        self.everyone = 0.0
        self.ours = 0.0

    def run(self, seconds: float, others_cores: float, our_cores: float) -> None:
        self.now += seconds
        self.everyone += seconds * (others_cores + our_cores)
        self.ours += seconds * our_cores

    def read(self) -> CpuTimes:
        return CpuTimes(self.everyone, self.ours, self.now)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    clock = Clock()
    monkeypatch.setattr(threads.time, "monotonic", lambda: clock.now)
    return clock


def governor(clock: Clock, most: int = 2, cpus: int = 2) -> tuple[ThreadGovernor, list[int]]:
    calls: list[int] = []
    return ThreadGovernor(most, cpus, calls.append, clock.read), calls


def test_a_busy_core_elsewhere_takes_one_thread_and_it_comes_back_when_it_is_free(
    clock: Clock,
) -> None:
    gov, calls = governor(clock)
    clock.run(1.0, others_cores=0.05, our_cores=2.0)  # quiet: our own time does not count
    gov.adjust()
    assert (gov.threads, calls) == (2, [])
    clock.run(1.0, others_cores=1.0, our_cores=1.0)  # a compiler on one core
    gov.adjust()
    assert (gov.threads, calls) == (1, [1])
    clock.run(1.0, others_cores=0.1, our_cores=1.0)
    gov.adjust()
    assert (gov.threads, calls) == (2, [1, 2])


def test_a_load_near_the_line_keeps_the_count_it_has(clock: Clock) -> None:
    gov, calls = governor(clock)
    for others in (0.6, 0.45, 0.55, 0.6):  # near half a core: two threads stay two
        clock.run(1.0, others_cores=others, our_cores=2.0)
        gov.adjust()
    assert calls == []
    clock.run(1.0, others_cores=0.8, our_cores=1.0)
    gov.adjust()
    for others in (0.4, 0.55, 0.6, 0.4):  # and one stays one
        clock.run(1.0, others_cores=others, our_cores=1.0)
        gov.adjust()
    assert calls == [1]


def test_the_load_is_read_once_a_second_not_every_step(clock: Clock) -> None:
    gov, calls = governor(clock)
    clock.run(0.5, others_cores=2.0, our_cores=0.0)
    gov.adjust()  # too soon to tell
    assert calls == []
    clock.run(0.6, others_cores=2.0, our_cores=0.0)
    gov.adjust()
    assert calls == [1]


def test_the_count_stays_between_one_and_the_configured_most(clock: Clock) -> None:
    gov, _ = governor(clock, most=4, cpus=16)
    assert [gov.threads_for(c) for c in (0.0, 0.4, 0.6, 12.2, 15.0, 40.0)] == [4, 4, 4, 4, 1, 1]
    assert [gov.threads_for(c) for c in (12.6, 13.6)] == [3, 2]


def test_without_proc_stat_the_count_never_changes(clock: Clock, tmp_path: Path) -> None:
    assert read_cpu_times(tmp_path / "missing") is None
    calls: list[int] = []
    gov = ThreadGovernor(2, 2, calls.append, lambda: None)
    clock.run(5.0, others_cores=2.0, our_cores=0.0)
    gov.adjust()
    assert (gov.threads, calls) == (2, [])


def test_proc_stat_is_read_as_everyones_busy_time_at_our_priority(tmp_path: Path) -> None:
    stat = tmp_path / "stat"
    # user nice system idle iowait irq softirq steal: the niced 500 yield to us, idle is idle
    stat.write_text("cpu  100 500 50 9000 30 5 5 40 0 0\ncpu0 1 2 3 4 5 6 7 8 0 0\n")
    times = read_cpu_times(stat)
    assert times is not None
    assert times.everyone_s == pytest.approx(200 / os.sysconf("SC_CLK_TCK"))
    assert times.ours_s > 0
