"""`PhaseProgress`: what a bench run shows while it runs — a rich progress bar per phase on a
terminal, plain numbered lines otherwise (logs, CI) — and its notes (a phase skipped, and why)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


class PhaseProgress:
    """Numbers each phase "phase 2/4" so a reader knows how far along the run is."""

    def __init__(self, console: Console, phases: int) -> None:
        self.console = console
        self.phases = phases
        self.current = 0

    @contextmanager
    def phase(self, title: str, total: int) -> Iterator[Callable[[str], None]]:
        """Yields `step(note)`, called once per unit of `total`."""
        self.current += 1
        title = f"phase {self.current}/{self.phases}: {title}"
        started = time.perf_counter()
        if self.console.is_terminal:
            with _bar(self.console) as bar:
                task = bar.add_task(title, total=total, note="")
                yield lambda note: bar.update(task, advance=1, note=note)
        else:
            self.say(title)
            count = iter(range(1, total + 1))
            yield lambda note: self.say(f"  {next(count, total)}/{total} {note}")
        self.say(f"{title}: done in {time.perf_counter() - started:.1f} s")

    @contextmanager
    def waiting(self, title: str) -> Iterator[None]:
        """A step with no count (server start-up): a spinner on a terminal."""
        started = time.perf_counter()
        if self.console.is_terminal:
            with self.console.status(title):
                yield
        else:
            self.say(title)
            yield
        self.say(f"{title}: ready in {time.perf_counter() - started:.1f} s")

    def say(self, line: str) -> None:
        self.console.print(f"[bench] {line}", highlight=False, markup=False)


def _bar(console: Console) -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[note]}"),
        console=console,
    )
