"""Charts as SVG text, rendered on the server: no JavaScript, nothing fetched.

Every label (days, team names, model ids: attacker-influenced, since a caller chooses its team
name's key and an operator the model ids) goes through `_text`, which escapes `& < > " '` and
drops characters XML 1.0 cannot hold, so a label is always character data, never markup.
Labels appear only as element text (`<text>`, `<title>`), never inside an attribute; attributes
hold only numbers and our own colours.  No `style` attribute or element: the console's
Content-Security-Policy forbids inline styles, and presentation attributes (`fill`, `stroke`)
are not styles.  Output is deterministic: the same data gives the same bytes (coordinates with
one decimal, series in the order given), so pages can be compared and cached.
"""

from __future__ import annotations

import html
import math
import re
from collections.abc import Mapping, Sequence

from .usage import UsageReport, tokens_by_team, totals_by_day

__all__ = ["bar_chart", "line_chart", "short_number", "usage_charts"]

PALETTE = ("#2f6db5", "#d9822b", "#3a9a5b", "#b5403a", "#7b5ea7", "#8c6d31", "#5f6b7a")
_INVALID_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")
_MAX_LABEL = 40
_LEFT, _RIGHT, _TOP, _BOTTOM = 64.0, 40.0, 36.0, 48.0  # room for a centred date at either end
_MAX_X_LABELS = 10
_LABEL_W = 84.0  # an x label's room: a date at font size 11, and a gap


def _text(value: str, limit: int = _MAX_LABEL) -> str:
    clean = _INVALID_XML.sub("", value)
    if len(clean) > limit:
        clean = clean[: limit - 1] + "\u2026"
    return html.escape(clean, quote=True)


def _n(value: float) -> str:
    return f"{value:.1f}"


def short_number(value: float) -> str:
    """1234 -> "1.2k", 648054920 -> "648.1M": axis labels."""
    for bound, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= bound:
            return f"{value / bound:.1f}".rstrip("0").rstrip(".") + suffix
    return f"{value:.0f}" if value == int(value) else f"{value:.1f}"


def _nice_step(top: float) -> float:
    """A round tick step (1, 2 or 5 x 10^k) giving at most 5 gridlines up to `top`."""
    if top <= 0:
        return 1.0
    raw = top / 4
    power = 10.0 ** math.floor(math.log10(raw))
    for step in (1, 2, 5, 10):
        if raw <= step * power:
            return step * power
    return 10.0 * power  # pragma: no cover (unreachable)


class _Frame:
    """The plot area and its axes for `count` x positions and values up to `top`."""

    def __init__(self, width: int, height: int, count: int, top: float) -> None:
        self.width, self.height, self.count = width, height, max(count, 1)
        self.step = _nice_step(top)
        self.ticks = max(1, math.ceil(top / self.step))
        self.top = self.step * self.ticks
        self.plot_w = width - _LEFT - _RIGHT
        self.plot_h = height - _TOP - _BOTTOM

    def x(self, index: float) -> float:
        return _LEFT + self.plot_w * (index + 0.5) / self.count

    def y(self, value: float) -> float:
        return _TOP + self.plot_h * (1 - value / self.top)

    def axes(self, labels: Sequence[str]) -> list[str]:
        parts = []
        for i in range(self.ticks + 1):
            value = self.step * i
            y = _n(self.y(value))
            parts.append(
                f'<line x1="{_n(_LEFT)}" y1="{y}" x2="{_n(self.width - _RIGHT)}" y2="{y}" '
                'stroke="#d0d4da" stroke-width="1"/>'
                f'<text x="{_n(_LEFT - 6)}" y="{y}" text-anchor="end" '
                f'dominant-baseline="middle" font-size="11" fill="#4a5260">'
                f"{_text(short_number(value))}</text>"
            )
        room = max(1, min(_MAX_X_LABELS, int(self.plot_w // _LABEL_W)))
        every = max(1, math.ceil(len(labels) / room))
        base = _n(self.height - _BOTTOM + 16)
        for i, label in enumerate(labels):
            if i % every == 0:
                parts.append(
                    f'<text x="{_n(self.x(i))}" y="{base}" text-anchor="middle" '
                    f'font-size="11" fill="#4a5260">{_text(label)}</text>'
                )
        return parts


def _open(title: str, width: int, height: int) -> list[str]:
    return [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" font-family="sans-serif">',
        f"<title>{_text(title, 200)}</title>",
        f'<text x="{_n(_LEFT)}" y="20" font-size="14" font-weight="bold" fill="#1d2430">'
        f"{_text(title, 200)}</text>",
    ]


def bar_chart(
    title: str,
    labels: Sequence[str],
    values: Sequence[int | float],
    *,
    width: int = 720,
    height: int = 280,
) -> str:
    """One bar per label; each bar's `<title>` (a tooltip) gives its label and value."""
    if len(labels) != len(values):
        raise ValueError("a bar chart needs one value per label")
    frame = _Frame(width, height, len(labels), max(values, default=0))
    parts = _open(title, width, height) + frame.axes(labels)
    bar_w = frame.plot_w / frame.count * 0.7
    for i, (label, value) in enumerate(zip(labels, values, strict=True)):
        y = frame.y(value)
        parts.append(
            f'<rect x="{_n(frame.x(i) - bar_w / 2)}" y="{_n(y)}" width="{_n(bar_w)}" '
            f'height="{_n(frame.y(0) - y)}" fill="{PALETTE[0]}">'
            f"<title>{_text(label)}: {_text(f'{value:,}')}</title></rect>"
        )
    parts.append("</svg>")
    return "\n".join(parts)


def line_chart(
    title: str,
    labels: Sequence[str],
    series: Mapping[str, Sequence[int | float]],
    *,
    width: int = 720,
    height: int = 280,
) -> str:
    """One line per series over the labels, with a legend; colours in the order given."""
    for values in series.values():
        if len(values) != len(labels):
            raise ValueError("a line chart needs one value per label in every series")
    top = max((max(v, default=0) for v in series.values()), default=0)
    frame = _Frame(width, height, len(labels), top)
    parts = _open(title, width, height) + frame.axes(labels)
    legend_x = _LEFT
    for index, (name, values) in enumerate(series.items()):
        colour = PALETTE[index % len(PALETTE)]
        points = " ".join(f"{_n(frame.x(i))},{_n(frame.y(v))}" for i, v in enumerate(values))
        parts.append(
            f'<polyline points="{points}" fill="none" stroke="{colour}" stroke-width="2">'
            f"<title>{_text(name)}</title></polyline>"
        )
        for i, value in enumerate(values):
            parts.append(
                f'<circle cx="{_n(frame.x(i))}" cy="{_n(frame.y(value))}" r="2.5" '
                f'fill="{colour}"><title>{_text(name)} {_text(labels[i])}: '
                f"{_text(f'{value:,}')}</title></circle>"
            )
        legend_y = _n(height - 12)
        parts.append(
            f'<rect x="{_n(legend_x)}" y="{_n(height - 21)}" width="10" height="10" '
            f'fill="{colour}"/><text x="{_n(legend_x + 14)}" y="{legend_y}" font-size="11" '
            f'fill="#1d2430">{_text(name, 24)}</text>'
        )
        legend_x += 14 + 7 * min(len(name), 24) + 18
    parts.append("</svg>")
    return "\n".join(parts)


def usage_charts(report: UsageReport) -> tuple[str, str]:
    """The usage page's two charts: requests per day (bars) and tokens per day by team
    (lines, the biggest teams and "(other)")."""
    days, requests, _ = totals_by_day(report)
    return (
        bar_chart("Requests per day (UTC)", days, requests),
        line_chart("Tokens per day by team (UTC)", days, tokens_by_team(report)),
    )
