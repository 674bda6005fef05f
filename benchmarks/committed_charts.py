"""The charts in docs/figures/, drawn by `semantic bench`'s own chart code from the figures
docs/benchmark-history.md records for the run they show: no run's raw JSON is committed, so the
values are those of its tables, copied here once.

    python benchmarks/committed_charts.py            # writes them into docs/figures/
    python benchmarks/committed_charts.py --check    # fails if a committed file differs

A new run draws its own beside its Markdown (`semantic bench --markdown FILE.md`), the crowd's
charts included; this script is for the runs whose charts the docs show.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from semantic_bench.charts import (
    DECODE,
    OUTPUT,
    AgentsTokS,
    HistoryTTFT,
    tok_s_by_agents,
    ttft_by_history_svg,
)

FIGURES = Path(__file__).parents[1] / "docs" / "figures"
# The full run of 2026-11-26 (docs/benchmark-history.md, "The full run"): its history scaling
# table (tokens, cold and warm TTFT medians), its single-stream and 8-stream decode, and the
# aggregate output of its 8-agent workload.
FULL_RUN_DATE = "2026-11-26"
FULL_RUN_HISTORY = [
    HistoryTTFT(1005, 1.208, 0.143),
    HistoryTTFT(2012, 2.297, 0.224),
    HistoryTTFT(4004, 5.393, 0.224),
]
FULL_RUN_TOK_S = [
    AgentsTokS(DECODE, 1, 75.0),
    AgentsTokS(DECODE, 8, 340.2),
    AgentsTokS(OUTPUT, 8, 103.1),
]


def committed() -> dict[str, str]:
    """Each committed chart's file name and the SVG the code draws for it."""
    history = f"Cold and warm time to first token by history, {FULL_RUN_DATE}"
    agents = tok_s_by_agents(
        FULL_RUN_TOK_S, f"Tokens a second by number of agents, {FULL_RUN_DATE}"
    )
    return {
        f"ttft-by-history-{FULL_RUN_DATE}.svg": ttft_by_history_svg(FULL_RUN_HISTORY, history),
        f"{agents.slug}-{FULL_RUN_DATE}.svg": agents.svg,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare, write nothing")
    args = parser.parse_args()
    stale = []
    for name, svg in committed().items():
        path = FIGURES / name
        if args.check:
            if not path.exists() or path.read_text(encoding="utf-8") != svg:
                stale.append(name)
        else:
            path.write_text(svg, encoding="utf-8")
            print(f"wrote {path}")
    for name in stale:
        print(f"{name}: not what the code draws; run python benchmarks/committed_charts.py")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
