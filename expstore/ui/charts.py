"""Small SVG charts drawn on the server (no chart library, nothing from a CDN): bars for
a histogram, a line with points for a value over a numeric axis (a policy version, seconds
ago). Each has a plot area (``rect.plot``) with the data inside it and the axes' ticks and
labels outside it, so no label ever sits on the data. Every text in them is escaped;
numbers are formatted here."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from html import escape

__all__ = ["bars", "line", "ticks"]

_W, _H = 360, 200
#: The plot area: left, top, right, bottom (room for the y ticks left, the title above,
#: the x ticks and the axis label below).
_L, _T, _R, _B = 46, 24, _W - 12, _H - 38


def ticks(low: float, high: float, most: int = 5) -> list[float]:
    """Round values from ``low`` to ``high`` (at most ``most`` of them, at least two),
    1, 2 or 5 times a power of ten apart."""
    if not (math.isfinite(low) and math.isfinite(high)):
        return [0.0, 1.0]
    if high <= low:
        high = low + (abs(low) or 1.0)
    raw = (high - low) / max(most - 1, 1)
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    start = math.floor(low / step) * step
    out = []
    value = start
    while value < high + step * 0.999:
        out.append(round(value, 12))
        value += step
    return out


def _num(value: float) -> str:
    if value == 0:
        return "0"
    if abs(value) >= 10_000 or abs(value) < 0.01:
        return f"{value:.2g}"
    return f"{value:.3g}"


def _frame(title: str, body: str, x_label: str = "", y_label: str = "") -> str:
    label = (
        f'<text x="{(_L + _R) / 2:.0f}" y="{_H - 6}" text-anchor="middle" class="axis-label">'
        f"{escape(x_label)}</text>"
        if x_label
        else ""
    )
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {_W} {_H}" '
        f'class="chart" role="img" aria-label="{escape(title)}">'
        f'<text x="4" y="14" class="chart-title">{escape(title)}'
        f"{' (' + escape(y_label) + ')' if y_label else ''}</text>"
        f'<rect x="{_L}" y="{_T}" width="{_R - _L}" height="{_B - _T}" class="plot"/>'
        f"{body}{label}</svg>"
    )


def _empty(title: str) -> str:
    return _frame(
        title, f'<text x="{_L + 8}" y="{(_T + _B) // 2}" class="empty">no data yet</text>'
    )


def _y_axis(low: float, high: float) -> tuple[Callable[[float], float], str]:
    """The y scale over ``low``..``high`` rounded out to ticks, and its ticks drawn left
    of the plot area with a grid line each."""
    marks = ticks(low, high)
    lo, hi = marks[0], marks[-1]
    span = (hi - lo) or 1.0
    pad = 4

    def y(value: float) -> float:
        return _B - pad - (_B - _T - 2 * pad) * (value - lo) / span

    parts = []
    for m in marks:
        at = y(m)
        parts.append(
            f'<line x1="{_L}" x2="{_R}" y1="{at:.1f}" y2="{at:.1f}" class="grid"/>'
            f'<text x="{_L - 4}" y="{at + 3:.1f}" text-anchor="end" class="tick">{_num(m)}'
            "</text>"
        )
    return y, "".join(parts)


def bars(
    title: str, items: Sequence[tuple[str, float]], *, x_label: str = "", y_label: str = ""
) -> str:
    """A bar per (label, value), the labels under the plot area (every few when many)."""
    if not items:
        return _empty(title)
    y, axis = _y_axis(0.0, max(v for _, v in items) or 1.0)
    width = (_R - _L - 4) / len(items)
    every = max(1, math.ceil(len(items) / 12))
    parts = [axis]
    for i, (label, value) in enumerate(items):
        x = _L + 2 + i * width
        top = y(value)
        parts.append(
            f'<rect x="{x + 1:.1f}" y="{top:.1f}" width="{max(width - 2, 1):.1f}" '
            f'height="{max(y(0.0) - top, 0):.1f}" class="bar">'
            f"<title>{escape(label)}: {value:g}</title></rect>"
        )
        if i % every == 0:
            parts.append(
                f'<text x="{x + width / 2:.1f}" y="{_B + 13}" text-anchor="middle" '
                f'class="tick">{escape(label)}</text>'
            )
    return _frame(title, "".join(parts), x_label, y_label)


def line(
    title: str,
    points: Sequence[tuple[float, float | None]],
    *,
    x_label: str = "",
    y_label: str = "",
    low: float | None = 0.0,
    x_text: Callable[[float], str] = _num,
) -> str:
    """A line through (x, value) points in order of x (a None value: a gap), with ticks on
    both axes: ``x_text`` writes an x tick."""
    known = [(x, v) for x, v in points if v is not None and math.isfinite(v)]
    if not known:
        return _empty(title)
    values = [v for _, v in known]
    y, axis = _y_axis(min(values) if low is None else min(low, *values), max(values))
    xs = [x for x, _ in known]
    x_marks = ticks(min(xs), max(xs) if max(xs) > min(xs) else min(xs) + 1, 6)
    x_lo, x_hi = x_marks[0], x_marks[-1]
    pad = 6

    def x_at(value: float) -> float:
        return _L + pad + (_R - _L - 2 * pad) * (value - x_lo) / ((x_hi - x_lo) or 1.0)

    parts = [axis]
    for m in x_marks:
        parts.append(
            f'<text x="{x_at(m):.1f}" y="{_B + 13}" text-anchor="middle" class="tick">'
            f"{escape(x_text(m))}</text>"
        )
    segment: list[str] = []
    runs: list[list[str]] = []
    for x, v in points:
        if v is None or not math.isfinite(v):
            if segment:
                runs.append(segment)
            segment = []
            continue
        segment.append(f"{x_at(x):.1f},{y(v):.1f}")
    if segment:
        runs.append(segment)
    for run in runs:
        parts.append(f'<polyline points="{" ".join(run)}" class="line"/>')
    if len(known) <= 60:
        for x, v in known:
            parts.append(
                f'<circle cx="{x_at(x):.1f}" cy="{y(v):.1f}" r="2.5" class="dot">'
                f"<title>{escape(x_text(x))}: {v:.4g}</title></circle>"
            )
    return _frame(title, "".join(parts), x_label, y_label)
