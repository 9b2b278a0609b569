"""The archive's monthly roll-up: sums of the job rows per (cluster, account, user,
partition, month of the end), so ``usage`` over whole months reads a few rows per group
whatever the number of jobs.

Each batch changes it by the difference its upserts made to the job rows (read before
and after, in the batch's own transaction): a job stored again adds nothing, a job whose
counters grew adds the growth, and a killed run leaves rows and sums as they were.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Connection, func, select

from slurm_gpu_exporter.report.archive.schema import jobs, usage_monthly
from slurm_gpu_exporter.report.figures.window import Window

GROUP = ("cluster", "account", "username", "partition", "end_month")
# In the roll-up table's column order (read.inconsistent compares them in that order):
# the summed job figures (figures/table.py ``rollup``) and the job's derived sums.
SUMS = tuple(c.name for c in usage_monthly.c if c.name not in (*GROUP, "jobs"))
CHUNK = 500  # job ids per IN list

Row = tuple[tuple[str, ...], tuple[float, ...]]  # group, sums


def job_sums(conn: Connection, keys: Sequence[tuple[str, str]]) -> dict[tuple[str, str], Row]:
    """Each stored job's group and counters, by (jobid, cluster)."""
    found: dict[tuple[str, str], Row] = {}
    wanted = set(keys)
    columns = [jobs.c[name] for name in GROUP]
    sums = [func.coalesce(jobs.c[name], 0.0) for name in SUMS]
    jobids = sorted({jobid for jobid, _ in keys})
    for i in range(0, len(jobids), CHUNK):
        # By job id alone, the primary key's first column: SQLite scans the whole key
        # for a (jobid, cluster) IN list. Other clusters' rows are dropped here.
        query = (select(jobs.c.jobid, jobs.c.cluster, *columns, *sums)
                 .where(jobs.c.jobid.in_(jobids[i:i + CHUNK])))
        for row in conn.execute(query):
            if (row[0], row[1]) in wanted:
                found[row[0], row[1]] = (tuple(row[2:2 + len(GROUP)]),
                                         tuple(float(v) for v in row[2 + len(GROUP):]))
    return found


def apply_change(conn: Connection, before: dict[tuple[str, str], Row],
                 after: dict[tuple[str, str], Row], insert: Callable[[Any], Any]) -> None:
    """Add to the roll-up what the batch changed: ``after`` minus ``before``."""
    deltas: dict[tuple[str, ...], list[float]] = {}
    for rows, sign in ((before, -1.0), (after, 1.0)):
        for group, sums in rows.values():
            delta = deltas.setdefault(group, [0.0] * (1 + len(SUMS)))
            delta[0] += sign
            for i, value in enumerate(sums):
                delta[1 + i] += sign * value
    changed = [{**dict(zip(GROUP, group, strict=True)), "jobs": round(d[0]),
                **dict(zip(SUMS, d[1:], strict=True))}
               for group, d in deltas.items() if any(d)]
    if not changed:
        return
    stmt = insert(usage_monthly)
    stmt = stmt.on_conflict_do_update(
        index_elements=[usage_monthly.c[name] for name in GROUP],
        set_={name: usage_monthly.c[name] + stmt.excluded[name] for name in ("jobs", *SUMS)})
    conn.execute(stmt, changed)


def month_start(t: float) -> datetime:
    moment = datetime.fromtimestamp(t, UTC)
    return moment.replace(day=1, hour=0, minute=0, second=0, microsecond=0)


def next_month(moment: datetime) -> datetime:
    return moment.replace(year=moment.year + moment.month // 12, month=moment.month % 12 + 1)


def split(window: Window) -> tuple[list[str], list[Window]]:
    """The whole months inside the window (YYYY-MM) and the pieces left at its edges."""
    first = month_start(window.start)
    if first.timestamp() < window.start:
        first = next_month(first)
    months: list[str] = []
    cursor = first
    while next_month(cursor).timestamp() <= window.end:
        months.append(cursor.strftime("%Y-%m"))
        cursor = next_month(cursor)
    if not months:
        return [], [window]
    edges = [Window(window.start, first.timestamp()), Window(cursor.timestamp(), window.end)]
    return months, [w for w in edges if w.end > w.start]
