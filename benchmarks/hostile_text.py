"""Hostile text: the worst inputs we know for every pattern and parser that reads client text (and
model output a client can steer), run at doubling sizes, so a reader sees each one's cost grow
linearly with its input.

    python benchmarks/hostile_text.py                   # each case at its doubling sizes
    python benchmarks/hostile_text.py --only stop       # the cases whose name holds "stop"
    python benchmarks/hostile_text.py --check           # each case's growth, n to 4n, linear?
    python benchmarks/hostile_text.py --only countdown --sizes 100,200,400
    python benchmarks/hostile_text.py --case NAME --size N    # one run; prints its seconds
    python benchmarks/hostile_text.py --case NAME --growth    # prints its growth exponent

A table row gives the seconds at each size (the least of three runs) and the growth exponent
between the first size and the last (time ~ size^k: k = 1 is linear, 2 quadratic, 3 cubic).

`--check` (and tests/unit/test_hostile_text_budget.py, a case at a time) measures the work of
each case, not its speed: the CPU time of the thread that runs it (time spent waiting for a
busy machine's cores is not in it) at its first size and at its last, four times larger, with
the garbage collector held off, the least of three interleaved runs each. A linear case grows
about 4×, a quadratic one 16×: it fails above an exponent of `MAX_GROWTH` (8×), or when it
does not finish within a hang guard (each case runs in its own process, since a regex cannot
be interrupted from the thread that runs it). No bound on seconds, so a slow or loaded machine
passes; a superlinear pattern fails on any machine.

Run against another checkout's code with `PYTHONPATH=<checkout>/src`; a case whose code is not
there is reported as such.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import math
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

Work = Callable[[], object]

# The most a case's work may grow, as the exponent k of size^k, between its first size and its
# last: 1 is linear, 2 quadratic; 1.5 is 8x for 4x the input, twice what a linear case does.
MAX_GROWTH = 1.5
# Seconds a `--check` child may take, imports included: only so that a pattern gone
# catastrophic (hours at these sizes) fails instead of hanging; a linear case takes seconds.
HANG_GUARD_S = 300.0
GROWTH_RUNS = 3


@dataclass(frozen=True, slots=True)
class Case:
    name: str
    what: str  # the code it exercises, and the input
    make: Callable[[int], Work]  # the input at size n, ready to run
    sizes: tuple[int, ...]  # doubling, for the table; the first and last for the growth check


# -- the cases ----------------------------------------------------------------------------------


def _strip_countdowns(text: str) -> Work:
    from semantic.text.claude_code import strip_countdowns

    return lambda: strip_countdowns(text)


def _countdown_repeats(opener: str) -> Callable[[int], Work]:
    return lambda n: _strip_countdowns(opener * n)


def _one_long_output_line(n: int) -> Work:
    # One reminder whose line holds n ` · session: ` and is not a countdown after all.
    return _strip_countdowns(
        "<system-reminder>Output tokens — turn: " + " · session: 1" * n + "\nno</system-reminder>"
    )


def _billing_header(n: int) -> Work:
    from semantic.text.claude_code import strip_billing_header

    text = " \n" * n + "x-anthropic-billing-header"
    return lambda: strip_billing_header(text)


def _legacy_session(n: int) -> Work:
    from semantic.api.anthropic import _session_in

    text = "user_" + "_session_" * n + "a-" * n + "!"
    return lambda: _session_in(text)


def _stop_run(stop_chars: int, output_chars: int) -> Work:
    """16 stops that share all but their last character, against output that matches all of
    them but never completes one, fed one character at a time."""
    from semantic.text.detokenizer import StopMatcher

    stops = tuple("a" * (stop_chars - 1) + chr(ord("b") + i) for i in range(16))
    output = "a" * output_chars

    def run() -> None:
        matcher = StopMatcher(stops)
        for char in output:
            matcher.feed(char)

    return run


def _long_stops(n: int) -> Work:
    return _stop_run(stop_chars=n, output_chars=4 * n)


def _long_output(n: int) -> Work:
    return _stop_run(stop_chars=256, output_chars=n)


def _deep_json(n: int) -> Work:
    from semantic.text import client_json

    nested = "[" * (client_json.MAX_DEPTH - 1) + "]" * (client_json.MAX_DEPTH - 1)
    text = "[" + ",".join([nested] * n) + "]"
    return lambda: client_json.loads(text)


def _wide_json(n: int) -> Work:
    from semantic.text import client_json

    text = "[" + ",".join(['{"a": [1, {"b": "c"}]}'] * n) + "]"
    return lambda: client_json.loads(text)


def _tool_parser(opener: str, unit: str) -> Callable[[int], Work]:
    def make(n: int) -> Work:
        from semantic.text.tool_formats import HermesParser

        def run() -> None:
            parser = HermesParser(["ls"])
            parser.feed(opener)
            for _ in range(n // len(unit)):
                parser.feed(unit)
            parser.finish()

        return run

    return make


def _coder_parser(opener: str, unit: str) -> Callable[[int], Work]:
    """QwenCoderParser fed `opener`, then `unit` to n characters, then the call's end."""

    def make(n: int) -> Work:
        from semantic.text.tool_formats import QwenCoderParser

        schema = {"type": "object", "properties": {"v": {"type": "array"}}}

        def run() -> None:
            parser = QwenCoderParser(["ls"], {"ls": schema})
            parser.feed(opener)
            for _ in range(n // len(unit)):
                parser.feed(unit)
            parser.feed("\n</parameter>\n</function>")
            parser.finish()

        return run

    return make


_CODER_CALL = "<tool_call>\n<function=ls>\n"


CASES = (
    Case(
        "countdown-output-tokens",
        "claude_code.strip_countdowns: `<system-reminder>Output tokens — turn: · session: ` x n",
        _countdown_repeats("<system-reminder>Output tokens — turn: · session: "),
        (40_000, 80_000, 160_000),
    ),
    Case(
        "countdown-output-tokens-one-line",
        "claude_code.strip_countdowns: one reminder line of n ` · session: 1`, then not one",
        _one_long_output_line,
        (128_000, 256_000, 512_000),
    ),
    Case(
        "countdown-remaining-turns",
        "claude_code.strip_countdowns: `<system-reminder>Remaining conversation turns: ` x n",
        _countdown_repeats("<system-reminder>Remaining conversation turns: "),
        (80_000, 160_000, 320_000),
    ),
    Case(
        "countdown-auto-compact",
        "claude_code.strip_countdowns: `<system-reminder>Messages until auto-compact: ` x n",
        _countdown_repeats("<system-reminder>Messages until auto-compact: "),
        (80_000, 160_000, 320_000),
    ),
    Case(
        "countdown-open-tags",
        "claude_code.strip_countdowns: `<system-reminder>\\n <total_tokens> 1` x n",
        _countdown_repeats("<system-reminder>\n <total_tokens> 1"),
        (80_000, 160_000, 320_000),
    ),
    Case(
        "billing-header",
        "claude_code.strip_billing_header: n blank lines, then the header's name",
        _billing_header,
        (1_600_000, 3_200_000, 6_400_000),
    ),
    Case(
        "legacy-session-id",
        "anthropic._session_in: `_session_` x n, `a-` x n, `!` (metadata.user_id)",
        _legacy_session,
        (160_000, 320_000, 640_000),
    ),
    Case(
        "stop-strings-length",
        "StopMatcher: 16 stops of n characters, 4n characters of output one at a time",
        _long_stops,
        (1_000, 2_000, 4_000),
    ),
    Case(
        "stop-strings-output",
        "StopMatcher: 16 stops of 256 characters, n characters of output one at a time",
        _long_output,
        (20_000, 40_000, 80_000),
    ),
    Case(
        "json-deep",
        "client_json.loads: n arrays nested to the depth limit, in one array",
        _deep_json,
        (1_000, 2_000, 4_000),
    ),
    Case(
        "json-wide",
        'client_json.loads: n objects `{"a": [1, {"b": "c"}]}` in one array',
        _wide_json,
        (20_000, 40_000, 80_000),
    ),
    Case(
        "tool-parser-whitespace",
        "HermesParser: n characters of spaces, four at a time",
        _tool_parser("", "    "),
        (16_000, 32_000, 64_000),
    ),
    Case(
        "tool-parser-whitespace-in-call",
        "HermesParser: `<tool_call>`, then n characters of spaces, four at a time",
        _tool_parser("<tool_call>", "    "),
        (256_000, 512_000, 1_024_000),
    ),
    Case(
        "coder-parser-long-value",
        "QwenCoderParser: a parameter of n characters of almost-closing tags, typed as an array",
        _coder_parser(_CODER_CALL + "<parameter=v>\n[", "</para</function "),
        (128_000, 256_000, 512_000),
    ),
    Case(
        "coder-parser-parameter-openings",
        "QwenCoderParser: n characters of `<parameter=` between parameters, never closed",
        _coder_parser(_CODER_CALL, "<parameter="),
        (128_000, 256_000, 512_000),
    ),
    Case(
        "coder-parser-call-openings",
        "QwenCoderParser: n characters of `<tool_call>\\n<function=`, none ever named",
        _coder_parser("", _CODER_CALL),
        (128_000, 256_000, 512_000),
    ),
)


# -- running them -------------------------------------------------------------------------------


def timed(case: Case, size: int, runs: int = 1) -> float | None:
    """Seconds for a run of `case` at `size`, the least of `runs`; None when this checkout
    lacks its code."""
    try:
        work = case.make(size)
    except ImportError:
        return None
    best = math.inf
    for _ in range(runs):
        start = time.perf_counter()
        work()
        best = min(best, time.perf_counter() - start)
    return best


def table(cases: list[Case]) -> None:
    print("| case | sizes | seconds | growth exponent |\n|---|---|---|---|")
    for case in cases:
        times = [timed(case, size, runs=3) for size in case.sizes]
        if any(t is None for t in times):
            print(f"| {case.name} | | not in this checkout | |")
            continue
        found = [t for t in times if t is not None]
        exponent = _growth(case.sizes[0], found[0], case.sizes[-1], found[-1])
        sizes = ", ".join(f"{size:,}" for size in case.sizes)
        seconds = ", ".join(f"{t:.4f}" for t in found)
        print(f"| {case.name} | {sizes} | {seconds} | {exponent:.1f} |")
    print()
    for case in cases:
        print(f"- {case.name}: {case.what}")


def _growth(size: int, seconds: float, larger: int, larger_seconds: float) -> float:
    """k such that the time grows as size^k between the two runs."""
    ratio = max(larger_seconds, 1e-9) / max(seconds, 1e-9)
    return math.log(ratio) / math.log(larger / size)


def _cpu_seconds(work: Work) -> float:
    """The CPU time of this thread for one run of `work`, the collector held off (its passes
    come when allocations say so, not in proportion to the work of the code under test)."""
    gc.collect()
    gc.disable()
    try:
        start = time.thread_time()
        work()
        return time.thread_time() - start
    finally:
        gc.enable()


def growth(case: Case) -> float | None:
    """The exponent k of size^k by which the work of `case` grows from its first size to its
    last, on CPU time, each the least of `GROWTH_RUNS` runs taken in turns (a slow moment of the
    machine falls on both sizes alike); None when this checkout lacks its code."""
    small, large = case.sizes[0], case.sizes[-1]
    try:
        works = {small: case.make(small), large: case.make(large)}
    except ImportError:
        return None
    best = dict.fromkeys(works, math.inf)
    for _ in range(GROWTH_RUNS):
        for size, work in works.items():
            best[size] = min(best[size], _cpu_seconds(work))
    return _growth(small, best[small], large, best[large])


def check_one(case: Case) -> str | None:
    """Run `case`'s growth check in a child process: None if linear, else what failed."""
    command = [sys.executable, __file__, "--case", case.name, "--growth"]
    try:
        run = subprocess.run(command, capture_output=True, text=True, timeout=HANG_GUARD_S)
    except subprocess.TimeoutExpired:
        return f"{case.name}: did not finish within the hang guard ({HANG_GUARD_S:g} s)"
    if run.returncode != 0:
        return f"{case.name}: exit {run.returncode}\n{run.stderr[-2000:]}"
    exponent = float(run.stdout.split()[-1])
    if exponent > MAX_GROWTH:
        return (
            f"{case.name}: its work grew as size^{exponent:.2f} from {case.sizes[0]:,} to "
            f"{case.sizes[-1]:,} (most allowed: size^{MAX_GROWTH:g})"
        )
    return None


def check(cases: list[Case]) -> bool:
    """Each case's growth in a child process: True if all are linear."""
    ok = True
    for case in cases:
        failure = check_one(case)
        print(f"FAIL {failure}" if failure else f"ok   {case.name}")
        ok = ok and failure is None
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="Only the cases whose name holds this.")
    parser.add_argument("--check", action="store_true", help="Each case's growth: linear?")
    parser.add_argument("--case", help="Run this one case once (with --size).")
    parser.add_argument("--size", type=int, help="The size for --case.")
    parser.add_argument(
        "--growth", action="store_true", help="With --case: its growth exponent, n to 4n."
    )
    parser.add_argument(
        "--sizes", help="Sizes for the table instead of each case's own: 100,200,400."
    )
    args = parser.parse_args()
    if args.case:
        case = next(c for c in CASES if c.name == args.case)
        found = growth(case) if args.growth else timed(case, args.size or case.sizes[-1])
        print("absent" if found is None else f"{found:.6f}")
        return 0 if found is not None else 2
    cases = [case for case in CASES if args.only in case.name]
    if args.sizes:
        sizes = tuple(int(size) for size in args.sizes.split(","))
        cases = [dataclasses.replace(case, sizes=sizes) for case in cases]
    if args.check:
        return 0 if check(cases) else 1
    table(cases)
    return 0


if __name__ == "__main__":
    sys.exit(main())
