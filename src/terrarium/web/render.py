"""Message text to safe HTML for the templates, and the SVG chart of messages per day.

The renderer is :mod:`terrarium.formats.safe_markdown` (the HTML export's); here its output is
marked safe for Jinja2. Message bodies are isolated with ``dir="auto"`` so one cannot reorder
the page around it.
"""

from __future__ import annotations

from html import escape
from typing import Any

from markupsafe import Markup

from terrarium.display import human_bytes, short_time
from terrarium.formats import safe_markdown
from terrarium.formats.safe_markdown import pygments_css

__all__ = ["bar_chart", "code", "figure", "human_bytes", "markdown", "pygments_css", "when"]


def when(ts: str | None) -> str:
    """A log timestamp as the CLI writes it, ``2026-11-28 02:28``, with ``UTC`` after it when
    the timestamp is in UTC (the log's are: ``...Z``); another is shown without a zone."""
    shown = short_time(ts)
    return f"{shown} UTC" if ts and ts.endswith(("Z", "+00:00")) else shown


def figure(count: int | None) -> str:
    """A count with thousands separators, ``19,794``."""
    return "" if count is None else f"{count:,}"


def markdown(text: str) -> Markup:
    """``text`` as safe HTML: Markdown, or plain preformatted text when very long."""
    return Markup(safe_markdown.markdown_html(text))


def code(text: str, lang: str = "json") -> Markup:
    """``text`` highlighted as ``lang`` (tool arguments and results), escaped."""
    return Markup(safe_markdown.code_html(text, lang))


PALETTE = ("#2563eb", "#16a34a", "#d97706", "#9333ea", "#dc2626", "#0891b2", "#4b5563")


def bar_chart(days: list[dict[str, Any]], types: list[str]) -> Markup:
    """Messages per day stacked by type, as an SVG with its totals and legend written in."""
    if not days:
        return Markup('<p class="muted">No messages yet.</p>')
    width, height, top, bottom, left = 760, 220, 20, 30, 8
    slot = (width - 2 * left) / len(days)
    bar = min(max(slot * 0.7, 1.0), 48.0)
    peak = max(sum(d["by_type"].values()) for d in days) or 1
    scale = (height - top - bottom) / peak
    legend = 20 * ((len(types) + 3) // 4)
    parts = [
        f'<svg class="chart" role="img" viewBox="0 0 {width} {height + legend}" '
        'xmlns="http://www.w3.org/2000/svg" aria-label="messages per day, stacked by type">'
    ]
    for i, day in enumerate(days):
        x = left + i * slot + (slot - bar) / 2
        y = height - bottom
        for t, kind in enumerate(types):
            n = day["by_type"].get(kind, 0)
            if not n:
                continue
            h = n * scale
            y -= h
            parts.append(
                f'<rect x="{x:.1f}" y="{y:.1f}" width="{bar:.1f}" height="{h:.1f}" '
                f'fill="{PALETTE[t % len(PALETTE)]}"><title>{escape(day["date"])} '
                f"{escape(kind)}: {n}</title></rect>"
            )
        total = sum(day["by_type"].values())
        if len(days) <= 40 and total:
            parts.append(
                f'<text x="{x + bar / 2:.1f}" y="{y - 4:.1f}" font-size="11" '
                f'text-anchor="middle" fill="currentColor">{total}</text>'
            )
    axis = height - bottom + 16
    parts.append(
        f'<text x="{left}" y="{axis}" font-size="11" fill="currentColor">'
        f"{escape(days[0]['date'])}</text>"
        f'<text x="{width - left}" y="{axis}" font-size="11" text-anchor="end" '
        f'fill="currentColor">{escape(days[-1]["date"])}</text>'
    )
    for t, kind in enumerate(types):
        lx, ly = left + (t % 4) * 180, height + 8 + (t // 4) * 20
        parts.append(
            f'<rect x="{lx}" y="{ly}" width="12" height="12" fill="{PALETTE[t % len(PALETTE)]}"/>'
            f'<text x="{lx + 18}" y="{ly + 11}" font-size="12" fill="currentColor">'
            f"{escape(kind)}</text>"
        )
    parts.append("</svg>")
    return Markup("".join(parts))
