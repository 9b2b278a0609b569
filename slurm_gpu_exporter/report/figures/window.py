"""The time window a report covers: ``--since 7d`` or ``--start``/``--end``."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime

from slurm_gpu_exporter.report.errors import ReportError

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DURATION_RE = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")


@dataclass(frozen=True)
class Window:
    """[start, end] in Unix seconds."""

    start: float
    end: float

    @property
    def seconds(self) -> int:
        return max(1, round(self.end - self.start))

    @property
    def range(self) -> str:
        """The window as a PromQL range duration, to the millisecond: a baseline taken
        ``offset`` this before the end falls on ``start`` itself, not up to half a second
        off it (a sample scraped in that half second was lost from, or added to, a short
        window's figures)."""
        ms = max(1, round((self.end - self.start) * 1000))
        return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


def parse_duration(text: str) -> float:
    """``7d``, ``36h``, ``1h30m`` or plain seconds -> seconds; ReportError when unreadable."""
    text = text.strip()
    if re.fullmatch(r"\d+(?:\.\d+)?", text):
        return float(text)
    parts = _DURATION_RE.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ReportError(f"bad duration {text!r}: use a number and a unit, e.g. 7d, 36h, 90m")
    return sum(float(n) * _UNITS[u] for n, u in parts)


def parse_time(text: str, now: float) -> float:
    """A Unix timestamp, an ISO 8601 date/time (UTC unless a zone is given), or ``now``."""
    text = text.strip()
    if text == "now":
        return now
    try:
        return float(text)
    except ValueError:
        pass
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise ReportError(f"bad time {text!r}: use ISO 8601 (2026-11-30T08:00), "
                          "a Unix timestamp or 'now'") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


def make_window(since: str | None, start: str | None, end: str | None, now: float,
                default_since: str = "7d") -> Window:
    """The window from the command line options; ReportError when it is empty or inverted."""
    if since is not None and start is not None:
        raise ReportError("give either --since or --start, not both")
    end_s = parse_time(end, now) if end is not None else now
    if start is not None:
        start_s = parse_time(start, now)
    else:
        length = parse_duration(since if since is not None else default_since)
        if length <= 0:
            raise ReportError("the window is empty: --since must be longer than 0 s")
        start_s = end_s - length
    if start_s >= end_s:
        raise ReportError("bad window: --start must be before --end")
    if end_s > now + 60:
        raise ReportError("bad window: --end is in the future")
    return Window(start_s, end_s)
