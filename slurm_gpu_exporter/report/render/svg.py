"""Inline SVG charts for the HTML report: no script, no fonts or files from the network."""

from __future__ import annotations

from html import escape

BAR = "#c0392b"
LINE = "#2c7fb8"
GRID = "#ddd"


def _svg(width: int, height: int, body: list[str], label: str) -> str:
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" role="img" aria-label="{escape(label)}">'
            + "".join(body) + "</svg>")


def _text(x: float, y: float, text: str, anchor: str = "start", size: int = 12) -> str:
    return (f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor="{anchor}">'
            f"{escape(text)}</text>")


def hbar_chart(items: list[tuple[str, float]], label: str, unit: str = "",
               width: int = 460) -> str:
    """Horizontal bars, one per (name, value), largest first as given."""
    bar_h, gap, left, right = 18, 6, 120, 70
    height = max(1, len(items)) * (bar_h + gap) + gap
    top = max((v for _, v in items), default=0.0) or 1.0
    body = []
    for i, (name, value) in enumerate(items):
        y = gap + i * (bar_h + gap)
        w = (width - left - right) * value / top
        body.append(_text(left - 6, y + bar_h - 4, name[:18], "end"))
        body.append(f'<rect class="bar" x="{left}" y="{y}" width="{w:.1f}" height="{bar_h}" '
                    f'fill="{BAR}"><title>{escape(name)}: {value:.1f}{unit}</title></rect>')
        body.append(_text(left + w + 4, y + bar_h - 4, f"{value:.1f}{unit}"))
    return _svg(width, height, body, label)


def histogram(values: list[float], label: str, bins: int = 10, width: int = 460,
              height: int = 200, mark: float | None = None) -> str:
    """Counts of ratios (0..1) in ``bins`` equal bins, with the threshold marked."""
    counts = [0] * bins
    for v in values:
        counts[min(bins - 1, max(0, int(v * bins)))] += 1
    left, right, bottom, top_pad = 40, 24, 30, 10
    plot_w, plot_h = width - left - right, height - bottom - top_pad
    top = max(counts, default=0) or 1
    body = [f'<line x1="{left}" y1="{top_pad + plot_h}" x2="{width - right}" '
            f'y2="{top_pad + plot_h}" stroke="#888"/>']
    bw = plot_w / bins
    for i, n in enumerate(counts):
        h = plot_h * n / top
        x = left + i * bw
        body.append(f'<rect class="bar" x="{x + 1:.1f}" y="{top_pad + plot_h - h:.1f}" '
                    f'width="{bw - 2:.1f}" height="{h:.1f}" fill="{LINE}">'
                    f"<title>{i * 100 // bins}-{(i + 1) * 100 // bins} %: {n} jobs</title>"
                    "</rect>")
        if n:
            body.append(_text(x + bw / 2, top_pad + plot_h - h - 2, str(n), "middle", 10))
    for i in range(0, bins + 1, 2):
        body.append(_text(left + i * bw, height - 12, f"{i * 100 // bins}%", "middle", 10))
    if mark is not None:
        x = left + plot_w * mark
        body.append(f'<line x1="{x:.1f}" y1="{top_pad}" x2="{x:.1f}" y2="{top_pad + plot_h}" '
                    f'stroke="{BAR}" stroke-dasharray="4 3"/>')
    body.append(_text(4, top_pad + 10, f"{top}", size=10))
    return _svg(width, height, body, label)


def line_chart(points: list[tuple[float, float]], start: float, end: float, label: str,
               width: int = 940, height: int = 90) -> str:
    """A ratio (0..1) over time, with 0 %, 50 % and 100 % grid lines."""
    left, right, pad = 40, 10, 8
    plot_w, plot_h = width - left - right, height - 2 * pad
    span = max(end - start, 1e-9)
    body = []
    for level in (0.0, 0.5, 1.0):
        y = pad + plot_h * (1 - level)
        body.append(f'<line x1="{left}" y1="{y:.1f}" x2="{width - right}" y2="{y:.1f}" '
                    f'stroke="{GRID}"/>')
        body.append(_text(left - 4, y + 4, f"{level:.0%}", "end", 10))
    coords = [(left + plot_w * (t - start) / span, pad + plot_h * (1 - v)) for t, v in points]
    if coords:
        path = " ".join(f"{x:.1f},{y:.1f}" for x, y in coords)
        body.append(f'<polyline class="line" fill="none" stroke="{LINE}" stroke-width="1.5" '
                    f'points="{path}"/>')
    else:
        body.append(_text(left + 8, pad + plot_h / 2, "no samples in the window", size=11))
    return _svg(width, height, body, label)
