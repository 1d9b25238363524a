"""Inline SVG charts for the HTML report: bars, grouped bars, columns and a timeline overview strip.

Each function returns an SVG document as a string (no scripts, no external references) sized in
pixels, with a ``<title>`` on each mark so hovering shows the exact value.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from html import escape

import numpy as np

from opgraph.export.common import kind_color, span_kind_key, track_order
from opgraph.ir import OpGraph, Timeline

FONT = "font-family:system-ui,-apple-system,'Segoe UI',Roboto,sans-serif;font-size:11px"


def _svg(width: float, height: float, body: list[str], label: str) -> str:
    return (
        f'<svg width="{width:.0f}" height="{height:.0f}" '
        f'viewBox="0 0 {width:.0f} {height:.0f}" role="img" aria-label="{escape(label)}" style="{FONT}">'
        + "".join(body)
        + "</svg>"
    )


def _clip(text: str, chars: int) -> str:
    return text if len(text) <= chars else text[: chars - 1] + "…"


def hbar_chart(
    items: Sequence[tuple[str, float, str]],
    *,
    fmt: Callable[[float], str],
    label: str,
    width: int = 640,
    label_width: int = 170,
    row: int = 18,
    max_value: float | None = None,
) -> str:
    """Horizontal bars: one ``(label, value, colour)`` per row, the value printed after the bar."""
    top = max_value if max_value is not None else max((v for _, v, _ in items), default=0.0)
    bar_w = width - label_width - 90
    body: list[str] = []
    for i, (name, value, color) in enumerate(items):
        y = i * row
        w = bar_w * value / top if top > 0 else 0.0
        body.append(
            f'<text x="{label_width - 6}" y="{y + row * 0.7:.1f}" text-anchor="end">{escape(_clip(name, 28))}</text>'
            f'<rect x="{label_width}" y="{y + 2}" width="{max(w, 0.5):.1f}" height="{row - 4}" fill="{color}">'
            f"<title>{escape(name)}: {escape(fmt(value))}</title></rect>"
            f'<text x="{label_width + w + 4:.1f}" y="{y + row * 0.7:.1f}" fill="#333">{escape(fmt(value))}</text>'
        )
    return _svg(width, max(1, len(items)) * row + 4, body, label)


def grouped_hbar_chart(
    categories: Sequence[str],
    series: Sequence[tuple[str, Sequence[float], str]],
    *,
    fmt: Callable[[float], str],
    label: str,
    width: int = 640,
    label_width: int = 170,
    bar: int = 9,
) -> str:
    """Horizontal bars grouped by category, one bar per series ``(name, values, colour)``, with a legend."""
    top = max((v for _, vals, _ in series for v in vals), default=0.0)
    bar_w = width - label_width - 90
    group = bar * len(series) + 8
    body: list[str] = []
    for s_i, (name, _, color) in enumerate(series):
        x = label_width + s_i * 200
        body.append(
            f'<rect x="{x}" y="2" width="10" height="10" fill="{color}"/>'
            f'<text x="{x + 14}" y="11">{escape(_clip(name, 30))}</text>'
        )
    for c_i, cat in enumerate(categories):
        y0 = 20 + c_i * group
        body.append(
            f'<text x="{label_width - 6}" y="{y0 + group / 2:.1f}" text-anchor="end">{escape(_clip(cat, 28))}</text>'
        )
        for s_i, (name, vals, color) in enumerate(series):
            v = vals[c_i]
            w = bar_w * v / top if top > 0 else 0.0
            y = y0 + s_i * bar
            body.append(
                f'<rect x="{label_width}" y="{y}" width="{max(w, 0.5):.1f}" height="{bar - 1}" fill="{color}">'
                f"<title>{escape(cat)}, {escape(name)}: {escape(fmt(v))}</title></rect>"
                f'<text x="{label_width + w + 4:.1f}" y="{y + bar - 1}" fill="#333" font-size="9">'
                f"{escape(fmt(v))}</text>"
            )
    return _svg(width, 24 + len(categories) * group, body, label)


def column_chart(
    items: Sequence[tuple[str, float]],
    *,
    fmt: Callable[[float], str],
    label: str,
    color: str = "#4C72B0",
    width: int = 640,
    height: int = 160,
) -> str:
    """Vertical columns (time per layer): labels under every column that has room."""
    n = max(1, len(items))
    top = max((v for _, v in items), default=0.0)
    left, bottom = 8, 18
    step = min((width - left * 2) / n, 48.0)
    width = int(max(200, left * 2 + n * step))
    every = max(1, int(28 // step) + 1) if step < 28 else 1
    body: list[str] = [
        f'<line x1="{left}" y1="{height - bottom}" x2="{width - left}" y2="{height - bottom}" stroke="#999"/>'
    ]
    for i, (name, v) in enumerate(items):
        h = (height - bottom - 8) * v / top if top > 0 else 0.0
        x = left + i * step
        body.append(
            f'<rect x="{x + step * 0.1:.1f}" y="{height - bottom - h:.1f}" width="{max(step * 0.8, 0.5):.1f}" '
            f'height="{h:.1f}" fill="{color}"><title>{escape(name)}: {escape(fmt(v))}</title></rect>'
        )
        if i % every == 0:
            body.append(
                f'<text x="{x + step / 2:.1f}" y="{height - 5}" text-anchor="middle" font-size="9">'
                f"{escape(name)}</text>"
            )
    return _svg(width, height, body, label)


def timeline_overview(
    timeline: Timeline, *, graph: OpGraph | None = None, width: int = 960, row: int = 16, start_us: float | None = None,
    end_us: float | None = None,
) -> str:  # fmt: skip
    """One strip per track: each pixel column takes the colour of the kind that kept the track busiest
    there, with its opacity the fraction of the column the track was busy. Cost O(spans + tracks x width)."""
    label_w = 110
    cols = width - label_w - 8
    t0 = timeline.start_us if start_us is None else start_us
    t1 = timeline.end_us if end_us is None else end_us
    extent = max(t1 - t0, 1e-9)
    tracks = track_order(timeline)
    row_of = {t: i for i, t in enumerate(tracks)}
    kinds: dict[str, int] = {}
    keys = [kinds.setdefault(span_kind_key(s, graph), len(kinds)) for s in timeline.spans]
    busy = np.zeros((len(tracks), len(kinds) or 1, cols))
    px = extent / cols
    for s, k in zip(timeline.spans, keys, strict=True):
        a = (s.start_us - t0) / px
        b = (s.end_us - t0) / px
        r = row_of[s.track]
        ia, ib = int(a), int(b)
        if ia == ib:
            if 0 <= ia < cols:
                busy[r, k, ia] += b - a
            continue
        if 0 <= ia < cols:
            busy[r, k, ia] += ia + 1 - a
        lo, hi = max(ia + 1, 0), min(ib, cols)
        if hi > lo:
            busy[r, k, lo:hi] += 1.0
        if 0 <= ib < cols:
            busy[r, k, ib] += b - ib
    names = list(kinds)
    body: list[str] = []
    for r, track in enumerate(tracks):
        y = r * row
        body.append(
            f'<text x="{label_w - 6}" y="{y + row * 0.72:.1f}" text-anchor="end">{escape(_clip(track, 16))}</text>'
        )
        body.append(f'<rect x="{label_w}" y="{y + 1}" width="{cols}" height="{row - 2}" fill="#f3f3f3"/>')
        total = busy[r].sum(axis=0)
        dominant = busy[r].argmax(axis=0)
        c = 0
        while c < cols:
            if total[c] <= 0:
                c += 1
                continue
            k = int(dominant[c])
            op = min(1.0, float(total[c]))
            e = c + 1
            while e < cols and total[e] > 0 and int(dominant[e]) == k and abs(min(1.0, float(total[e])) - op) < 0.1:
                e += 1
            body.append(
                f'<rect x="{label_w + c}" y="{y + 1}" width="{e - c}" height="{row - 2}" '
                f'fill="{kind_color(names[k])}" fill-opacity="{max(op, 0.15):.2f}"/>'
            )
            c = e
    axis_y = len(tracks) * row + 12
    for i in range(6):
        x = label_w + cols * i / 5
        t = extent * i / 5
        body.append(f'<line x1="{x:.1f}" y1="{axis_y - 10}" x2="{x:.1f}" y2="{axis_y - 6}" stroke="#999"/>')
        anchor = "start" if i == 0 else ("end" if i == 5 else "middle")
        body.append(f'<text x="{x:.1f}" y="{axis_y + 2}" text-anchor="{anchor}" font-size="9">{_fmt_axis(t)}</text>')
    return _svg(width, axis_y + 6, body, f"timeline overview of {len(tracks)} tracks")


def _fmt_axis(us: float) -> str:
    if us >= 1e6:
        return f"{us / 1e6:.3g} s"
    if us >= 1e3:
        return f"{us / 1e3:.3g} ms"
    return f"{us:.3g} us"
