"""SVG charts drawn by hand (no plotting library): named series of points over two axes that
start at zero, joined by a line or not, each point labelled with its value when asked. The
bench's charts (`charts.py`) are drawn with it."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from html import escape

WIDTH, HEIGHT = 640, 360
LEFT, RIGHT, TOP, BOTTOM = 64, 24, 48, 48  # margins around the plot area
# One colour per series, in order: the first two are the history chart's cold and warm.
PALETTE = ("#d9480f", "#1971c2", "#2f9e44", "#9c36b5", "#f08c00", "#495057")

Scale = Callable[[float], float]  # a value to its coordinate in the picture


@dataclass(slots=True, frozen=True)
class Series:
    """One named set of (x, y) points. `joined` draws a line through them in x order; `label`,
    when given, writes each point's value beside it."""

    name: str
    points: tuple[tuple[float, float], ...]
    joined: bool = True
    label: Callable[[float], str] | None = None


@dataclass(slots=True, frozen=True)
class Axis:
    """An axis from 0 to `top` (> 0), its name, and the ticks written along it (value, text)."""

    name: str
    top: float
    ticks: tuple[tuple[float, str], ...]


def round_ticks(top: float) -> tuple[tuple[float, str], ...]:
    """Ticks from 0 up to `top` (> 0) at a round step, 1, 2 or 5 times a power of ten, that
    gives about five of them, each written with the decimals its step needs."""
    least = top / 5
    power = 10 ** math.floor(math.log10(least))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= least)
    decimals = max(0, -math.floor(math.log10(step)))
    count = int(top / step + 1e-9)
    return tuple((i * step, f"{i * step:.{decimals}f}") for i in range(count + 1))


def chart_svg(title: str, series: Sequence[Series], x_axis: Axis, y_axis: Axis) -> str:
    """The whole picture: the title, the axes, then each series in its colour with a legend
    line; every series is a `<g class="series">` so a reader (or a test) can find its points."""

    def x(value: float) -> float:
        return LEFT + value / x_axis.top * (WIDTH - LEFT - RIGHT)

    def y(value: float) -> float:
        return HEIGHT - BOTTOM - value / y_axis.top * (HEIGHT - TOP - BOTTOM)

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {HEIGHT}" '
        f'width="{WIDTH}" height="{HEIGHT}" font-family="sans-serif" font-size="12">',
        f'<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>',
        f'<text x="{WIDTH / 2}" y="24" text-anchor="middle" font-size="14">{escape(title)}</text>',
        *_axes(x_axis, y_axis, x, y),
    ]
    for index, one in enumerate(series):
        parts += _series(one, index, x, y)
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def _series(series: Series, index: int, x: Scale, y: Scale) -> list[str]:
    color = PALETTE[index % len(PALETTE)]
    points = sorted(series.points)
    parts = [f'<g class="series" data-series="{escape(series.name)}">']
    if series.joined and len(points) > 1:
        line = " ".join(f"{x(px):.1f},{y(py):.1f}" for px, py in points)
        parts.append(f'<polyline points="{line}" fill="none" stroke="{color}" stroke-width="2"/>')
    for px, py in points:
        cx, cy = x(px), y(py)
        parts.append(f'<circle cx="{cx:.1f}" cy="{cy:.1f}" r="3.5" fill="{color}"/>')
        if series.label is not None:
            # The first series' labels to the upper left, clear of a rising line; others' right.
            dx, anchor = (-6, "end") if index == 0 else (6, "start")
            parts.append(
                f'<text x="{cx + dx:.1f}" y="{cy - 8:.1f}" text-anchor="{anchor}" '
                f'fill="{color}">{series.label(py)}</text>'
            )
    legend_y = TOP + 18 * index
    parts.append(
        f'<text x="{LEFT + 12}" y="{legend_y + 4}" fill="{color}">— {escape(series.name)}</text>'
    )
    parts.append("</g>")
    return parts


def _axes(x_axis: Axis, y_axis: Axis, x: Scale, y: Scale) -> list[str]:
    """Both axes' lines, their ticks' texts and their names."""
    x0, y0 = x(0), y(0)
    lines = [
        f'<line x1="{x0}" y1="{y0}" x2="{WIDTH - RIGHT}" y2="{y0}" stroke="#444"/>',
        f'<line x1="{x0}" y1="{y0}" x2="{x0}" y2="{TOP - 8}" stroke="#444"/>',
    ]
    for value, text in x_axis.ticks:
        lines.append(f'<text x="{x(value):.1f}" y="{y0 + 16}" text-anchor="middle">{text}</text>')
    for value, text in y_axis.ticks:
        lines.append(f'<text x="{x0 - 6}" y="{y(value) + 4:.1f}" text-anchor="end">{text}</text>')
    lines.append(
        f'<text x="{(x0 + WIDTH - RIGHT) / 2}" y="{HEIGHT - 8}" text-anchor="middle">'
        f"{escape(x_axis.name)}</text>"
    )
    lines.append(
        f'<text x="16" y="{(TOP + y0) / 2}" text-anchor="middle" '
        f'transform="rotate(-90 16 {(TOP + y0) / 2})">{escape(y_axis.name)}</text>'
    )
    return lines
