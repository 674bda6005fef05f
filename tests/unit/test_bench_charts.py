"""The bench's charts: an SVG of cold and warm time to first token by history length, written
beside the run's Markdown, and the committed run's chart in the docs drawn by the same code."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

from semantic.bench.charts import HistoryTTFT, ttft_by_history_svg

DOCS = Path(__file__).parents[2] / "docs"
# The full run of 2026-11-26 (docs/benchmark-history.md, "History scaling"): history tokens,
# cold and warm TTFT medians.
FULL_RUN = [
    HistoryTTFT(1005, 1.208, 0.143),
    HistoryTTFT(2012, 2.297, 0.224),
    HistoryTTFT(4004, 5.393, 0.224),
]
FULL_RUN_TITLE = "Cold and warm time to first token by history, 2026-11-26"
COMMITTED = DOCS / "figures" / "ttft-by-history-2026-11-26.svg"


def test_the_chart_is_svg_with_both_lines_and_every_value() -> None:
    svg = ttft_by_history_svg(FULL_RUN, FULL_RUN_TITLE)
    root = ET.fromstring(svg)
    ns = "{http://www.w3.org/2000/svg}"
    assert root.tag == f"{ns}svg"
    assert len(root.findall(f"{ns}polyline")) == 2  # cold and warm
    texts = [text.text for text in root.iter(f"{ns}text")]
    for point in FULL_RUN:
        assert f"{point.cold_s:.3f} s" in texts and f"{point.warm_s:.3f} s" in texts
        assert f"{point.tokens:,}" in texts


def test_the_docs_show_the_committed_runs_chart_as_the_code_draws_it() -> None:
    assert COMMITTED.read_text() == ttft_by_history_svg(FULL_RUN, FULL_RUN_TITLE)
    assert f"figures/{COMMITTED.name}" in (DOCS / "benchmarks.md").read_text()
