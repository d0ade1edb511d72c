"""Small SVG charts drawn on the server (no chart library, nothing from a CDN): bars for
a histogram, a line with points for a value by policy version. Every text in them is
escaped; numbers are formatted here."""

from __future__ import annotations

from collections.abc import Sequence
from html import escape

__all__ = ["bars", "line"]

_W, _H, _PAD = 360, 140, 24


def _frame(title: str, body: str) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {_W} {_H + _PAD * 2}" '
        f'class="chart" role="img" aria-label="{escape(title)}">'
        f'<text x="4" y="14" class="chart-title">{escape(title)}</text>{body}</svg>'
    )


def bars(title: str, items: Sequence[tuple[str, float]]) -> str:
    """A bar per (label, value), labels under the bars, the value above each."""
    if not items:
        return _frame(title, f'<text x="4" y="{_H // 2 + _PAD}">no data yet</text>')
    top = max(v for _, v in items) or 1.0
    width = (_W - 8) / len(items)
    parts = []
    for i, (label, value) in enumerate(items):
        h = (_H - 10) * value / top
        x = 4 + i * width
        y = _PAD + (_H - h)
        parts.append(
            f'<rect x="{x + 1:.1f}" y="{y:.1f}" width="{max(width - 2, 1):.1f}" '
            f'height="{h:.1f}" class="bar"><title>{escape(label)}: {value:g}</title></rect>'
        )
        if len(items) <= 16:
            parts.append(
                f'<text x="{x + width / 2:.1f}" y="{_H + _PAD + 14}" text-anchor="middle" '
                f'class="tick">{escape(label)}</text>'
                f'<text x="{x + width / 2:.1f}" y="{y - 2:.1f}" text-anchor="middle" '
                f'class="tick">{value:g}</text>'
            )
    return _frame(title, "".join(parts))


def line(title: str, points: Sequence[tuple[str, float | None]], *, low: float = 0.0) -> str:
    """A line through (label, value) points in order (None: a gap)."""
    known = [v for _, v in points if v is not None]
    if not known:
        return _frame(title, f'<text x="4" y="{_H // 2 + _PAD}">no data yet</text>')
    lo, hi = min(low, min(known)), max(known)
    span = (hi - lo) or 1.0
    step = (_W - 16) / max(len(points) - 1, 1)
    coords = []
    marks = []
    for i, (label, value) in enumerate(points):
        if value is None:
            continue
        x = 8 + i * step
        y = _PAD + (_H - 10) * (1 - (value - lo) / span)
        coords.append(f"{x:.1f},{y:.1f}")
        marks.append(
            f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3" class="dot">'
            f"<title>{escape(label)}: {value:.4g}</title></circle>"
        )
    body = (
        f'<polyline points="{" ".join(coords)}" class="line"/>'
        + "".join(marks)
        + f'<text x="4" y="{_H + _PAD + 14}" class="tick">{escape(points[0][0])}</text>'
        + f'<text x="{_W - 4}" y="{_H + _PAD + 14}" text-anchor="end" class="tick">'
        f"{escape(points[-1][0])}</text>"
        + f'<text x="{_W - 4}" y="{_PAD + 8}" text-anchor="end" class="tick">{hi:.3g}</text>'
    )
    return _frame(title, body)
