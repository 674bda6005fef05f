"""The bench's charts as SVG, drawn by hand (no plotting library): cold and warm time to first
token by history length, written beside the run's Markdown and shown by the docs."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from html import escape

from semantic.bench.history import HistoryResult

WIDTH, HEIGHT = 640, 360
LEFT, RIGHT, TOP, BOTTOM = 64, 24, 48, 48  # margins around the plot area
COLD, WARM = "#d9480f", "#1971c2"

Scale = Callable[[float], float]  # a value to its coordinate in the picture


@dataclass(slots=True, frozen=True)
class HistoryTTFT:
    """One history length: the median time to first token of its cold and warm turns."""

    tokens: int
    cold_s: float
    warm_s: float


def history_points(history: HistoryResult) -> list[HistoryTTFT]:
    return [
        HistoryTTFT(p.history_tokens, p.cold_ttft_s, p.warm_ttft_s)
        for p in sorted(history.points, key=lambda p: p.history_tokens)
    ]


def ttft_by_history_svg(points: Sequence[HistoryTTFT], title: str) -> str:
    """Two lines over history length, cold and warm, each point labelled with its seconds."""
    top_s = max(p.cold_s for p in points) * 1.15 or 1.0
    top_tokens = max(p.tokens for p in points) * 1.05

    def x(tokens: float) -> float:
        return LEFT + tokens / top_tokens * (WIDTH - LEFT - RIGHT)

    def y(seconds: float) -> float:
        return HEIGHT - BOTTOM - seconds / top_s * (HEIGHT - TOP - BOTTOM)

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {HEIGHT}" '
        f'width="{WIDTH}" height="{HEIGHT}" font-family="sans-serif" font-size="12">',
        f'<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>',
        f'<text x="{WIDTH / 2}" y="24" text-anchor="middle" font-size="14">{escape(title)}</text>',
        *_axes(points, top_s, x, y),
    ]
    for name, color, value in (("cold", COLD, _cold), ("warm", WARM, _warm)):
        line = " ".join(f"{x(p.tokens):.1f},{y(value(p)):.1f}" for p in points)
        parts.append(f'<polyline points="{line}" fill="none" stroke="{color}" stroke-width="2"/>')
        for p in points:
            cx, cy = x(p.tokens), y(value(p))
            parts.append(f'<circle cx="{cx:.1f}" cy="{cy:.1f}" r="3.5" fill="{color}"/>')
            # Cold labels to the upper left, clear of their rising line; warm ones above.
            dx, anchor = (-6, "end") if name == "cold" else (6, "start")
            parts.append(
                f'<text x="{cx + dx:.1f}" y="{cy - 8:.1f}" text-anchor="{anchor}" '
                f'fill="{color}">{value(p):.3f} s</text>'
            )
        legend_y = TOP + (0 if name == "cold" else 18)
        parts.append(
            f'<text x="{LEFT + 12}" y="{legend_y + 4}" fill="{color}">— {name} turns</text>'
        )
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def _cold(point: HistoryTTFT) -> float:
    return point.cold_s


def _warm(point: HistoryTTFT) -> float:
    return point.warm_s


def _axes(points: Sequence[HistoryTTFT], top_s: float, x: Scale, y: Scale) -> list[str]:
    """The axes, a tick at each history length, five on the seconds, and the axes' names."""
    x0, y0 = x(0), y(0)
    lines = [
        f'<line x1="{x0}" y1="{y0}" x2="{WIDTH - RIGHT}" y2="{y0}" stroke="#444"/>',
        f'<line x1="{x0}" y1="{y0}" x2="{x0}" y2="{TOP - 8}" stroke="#444"/>',
    ]
    for p in points:
        lines.append(
            f'<text x="{x(p.tokens):.1f}" y="{y0 + 16}" text-anchor="middle">{p.tokens:,}</text>'
        )
    for i in range(6):
        seconds = top_s * i / 5
        lines.append(
            f'<text x="{x0 - 6}" y="{y(seconds) + 4:.1f}" text-anchor="end">{seconds:.1f}</text>'
        )
    lines.append(
        f'<text x="{(x0 + WIDTH - RIGHT) / 2}" y="{HEIGHT - 8}" text-anchor="middle">'
        "history (tokens)</text>"
    )
    lines.append(
        f'<text x="16" y="{(TOP + y0) / 2}" text-anchor="middle" '
        f'transform="rotate(-90 16 {(TOP + y0) / 2})">time to first token (s)</text>'
    )
    return lines
