"""The machine a bench run measured, as its report names it: CPU model, cores, OS and torch; and
the rate its memory reads at now, which bounds a decode step (`memory_read_gbs`)."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import statistics
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass(slots=True, frozen=True)
class Machine:
    cpu: str  # the model name /proc/cpuinfo gives, else what `platform` knows
    cores: int  # CPUs this process may run on
    system: str  # e.g. "Linux x86_64"
    torch: str | None  # the installed torch version; None without torch

    @classmethod
    def this(cls) -> Machine:
        return cls(_cpu_model(), _cores(), f"{platform.system()} {platform.machine()}", _torch())

    def __str__(self) -> str:
        torch = f"torch {self.torch}" if self.torch else "no torch"
        return f"{self.cpu}, {self.cores} cores, {self.system}, {torch}"


def memory_read_gbs() -> float:
    """GB/s this process reads a 1 GiB tensor at, the median of 5 reads: the bandwidth a decode
    step, which reads every weight once, is bound by. On a shared machine it moves with the
    neighbours' load (from 34 to 64 GB/s within minutes on the 2-vCPU test machine), so a run
    that compares decode speeds measures it beside each. Imports torch (seconds)."""
    import torch  # only here: naming the machine needs no torch

    data = torch.ones(2**28)
    seconds = []
    for _ in range(6):
        started = time.perf_counter()
        data.sum()
        seconds.append(time.perf_counter() - started)
    return data.numel() * data.element_size() / statistics.median(seconds[1:]) / 1e9


def _cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    try:
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass  # not Linux
    return platform.processor() or "unknown CPU"


def _cores() -> int:
    if hasattr(os, "sched_getaffinity"):  # a container may see more CPUs than it may use
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _torch() -> str | None:
    # The installed version, without importing torch (seconds) just to name it.
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return None
