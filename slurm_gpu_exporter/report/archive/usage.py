"""``slurm-gpu-report usage``: GPU-hours held, busy and wasted per group, from the archive.

A job counts in the window (and the month) in which it ended, with its whole life:
the archive holds one summary per job, not its samples.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

from slurm_gpu_exporter.report.archive.read import BY_KEYS
from slurm_gpu_exporter.report.archive.store import ArchiveStore
from slurm_gpu_exporter.report.errors import ReportError
from slurm_gpu_exporter.report.figures.usage import UsageGroup, UsageReport
from slurm_gpu_exporter.report.figures.window import Window


def month_window(month: str, now: float) -> Window:
    """``2026-11`` -> [1 Nov 00:00 UTC, 1 Dec 00:00 UTC), cut at now for this month."""
    try:
        start = datetime.strptime(month, "%Y-%m").replace(tzinfo=UTC)
    except ValueError:
        raise ReportError(f"bad --month {month!r}: use YYYY-MM, e.g. 2026-11") from None
    end = start.replace(year=start.year + start.month // 12, month=start.month % 12 + 1)
    if start.timestamp() >= now:
        raise ReportError(f"bad --month {month}: it has not begun yet")
    return Window(start.timestamp(), min(end.timestamp(), now))


def check_by(by: Sequence[str]) -> tuple[str, ...]:
    """The --by keys in order, each once; ReportError for an unknown one."""
    keys = tuple(dict.fromkeys(by))
    unknown = [k for k in keys if k not in BY_KEYS]
    if unknown or not keys:
        raise ReportError(f"bad --by {' '.join(unknown)}: use one or more of "
                          f"{', '.join(BY_KEYS)}")
    return keys


def spans_months(window: Window) -> bool:
    first = datetime.fromtimestamp(window.start, UTC).strftime("%Y-%m")
    last = datetime.fromtimestamp(max(window.start, window.end - 1), UTC).strftime("%Y-%m")
    return first != last


def usage_report(store: ArchiveStore, window: Window, by: Sequence[str],
                 cluster: str | None = None) -> UsageReport:
    """Per-group sums, largest GPU-hours first; per month too when the window spans months
    (one query either way: by group and month, summed here)."""
    keys = check_by(by)
    months = spans_months(window)
    rows = store.usage(window, keys, cluster, by_month=months)
    groups: dict[tuple[str, ...], UsageGroup] = {}
    by_month: dict[str, UsageGroup] = {}
    for row in rows:
        for total in (groups.setdefault(row.key, UsageGroup(row.key)),
                      *([by_month.setdefault(row.month, UsageGroup((), row.month))]
                        if months else [])):
            total.jobs += row.jobs
            total.add(row.sums())
    ordered = sorted(groups.values(), key=lambda g: (-g.allocated_s, g.key))
    return UsageReport(window=window, by=keys, groups=ordered,
                       months=[by_month[m] for m in sorted(by_month)], source=store.where,
                       emissions_archived=any(g.emissions_g for g in ordered))
