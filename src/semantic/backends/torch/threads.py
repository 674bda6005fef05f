"""How many threads the torch backend computes with on the CPU: every core it may use while the
rest of the machine is idle, only the cores other programs leave free while they are busy.

An OpenMP thread that finishes its share of an op spins for the next one (GNU OpenMP, torch's on
Linux, for ~3 ms) before it sleeps. On an idle machine that is what makes small ops fast, but
when another program holds a core the spinning thread keeps the one it waits for off its core:
single-stream decode fell from ~88 to 12-19 tok/s on the 2-core test machine beside one other
busy program, and following the load keeps 42-55 (docs/benchmark-history.md, "Threads that
wait"). A shorter spin everywhere (GOMP_SPINCOUNT) lost 15-30% on the idle machine, so the count of
threads follows the load instead: once a second, from what the other programs used of the CPUs
meanwhile (`/proc/stat` less this process's own time; programs at a lower priority than ours,
which yield to us, do not count). Elsewhere than Linux the count stays as configured.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

INTERVAL_S = 1.0  # how often the load is read: a step is ~10-20 ms, a read ~50 µs
SPARE_CORE = 0.5  # others using less than this share of a core leave it to us
MARGIN = 0.15  # a count changes only once the load is this far past the line, so it never flaps
_PROC_STAT = Path("/proc/stat")


@dataclass(slots=True, frozen=True)
class CpuTimes:
    """Seconds of CPU time since boot: everyone's at our priority or above, and our own."""

    everyone_s: float
    ours_s: float
    at_s: float  # when read, on the monotonic clock


def read_cpu_times(path: Path = _PROC_STAT) -> CpuTimes | None:
    """Now's CPU times, or None where `/proc/stat` cannot be read (not Linux)."""
    try:
        fields = path.read_text().split("\n", 1)[0].split()[1:]
    except OSError:
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(f) for f in fields[:8])
    niced = os.getpriority(os.PRIO_PROCESS, 0) > 0  # then our own time is counted as nice
    busy = user + system + irq + softirq + steal + (nice if niced else 0)
    own = os.times()
    return CpuTimes(busy / os.sysconf("SC_CLK_TCK"), own.user + own.system, time.monotonic())


class ThreadGovernor:
    """Sets torch's thread count between steps from the load of the other programs.

    `adjust()` is called by the thread that runs the model (OpenMP's count belongs to the thread
    that starts the parallel work), before each step; it reads the load at most every
    `INTERVAL_S`. The count stays within 1 .. `most`."""

    def __init__(
        self,
        most: int,
        cpus: int,
        set_threads: Callable[[int], None],
        read: Callable[[], CpuTimes | None] = read_cpu_times,
    ) -> None:
        self.most = most
        self.cpus = cpus
        self.threads = most
        self._set_threads = set_threads
        self._read = read
        self._last = read()

    def adjust(self) -> None:
        last = self._last
        if last is None or time.monotonic() - last.at_s < INTERVAL_S:
            return
        now = self._read()
        if now is None:
            return
        self._last = now
        others = others_cores(last, now)
        # Within MARGIN of a line, keep the count: neither reading is sure enough to move it.
        most_allowed, least_needed = (
            self.threads_for(others - MARGIN),
            self.threads_for(others + MARGIN),
        )
        wanted = min(max(self.threads, least_needed), most_allowed)
        if wanted != self.threads:
            log.info(
                "computing with %d of %d threads: others use %.1f cores", wanted, self.most, others
            )
            self._set_threads(wanted)
            self.threads = wanted

    def threads_for(self, others_cores: float) -> int:
        """The cores the others leave free, no more than `most`, at least one."""
        taken = max(0, math.ceil(others_cores - SPARE_CORE))
        return max(1, min(self.most, self.cpus - taken))


def others_cores(last: CpuTimes, now: CpuTimes) -> float:
    """How many cores the other programs kept busy, on average, between two readings."""
    others_s = (now.everyone_s - last.everyone_s) - (now.ours_s - last.ours_s)
    return others_s / (now.at_s - last.at_s)
