"""How times and sizes are written for people, the same in the CLI and the dashboard."""

from __future__ import annotations


def short_time(ts: str | None) -> str:
    """``2025-11-06T14:35:12.98Z`` -> ``2025-11-06 14:35`` (as stored, no time zone maths)."""
    if not ts:
        return "-"
    return ts[:16].replace("T", " ")


def human_bytes(count: int) -> str:
    """``1536`` -> ``1.5 KiB``."""
    size = float(count)
    for unit in ("B", "KiB", "MiB"):
        if abs(size) < 1024:
            return f"{int(size)} B" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GiB"
