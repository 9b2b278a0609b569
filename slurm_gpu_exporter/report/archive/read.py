"""Reading the job archive: jobs by id, the jobs that ended in a window, sums per group
from the roll-up and the job rows, and the consistency check. Each is a fixed number of
queries on a connection the store opened, whatever the number of jobs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection, and_, func, select

from slurm_gpu_exporter.report.archive.rollup import GROUP, SUMS, split
from slurm_gpu_exporter.report.archive.rows import detail_of, usage_of
from slurm_gpu_exporter.report.archive.schema import gpus, jobs, usage_monthly
from slurm_gpu_exporter.report.figures.shapes import JobDetail, JobUsage
from slurm_gpu_exporter.report.figures.usage import UsageGroup
from slurm_gpu_exporter.report.figures.window import Window

BY_KEYS = {"account": "account", "user": "username", "partition": "partition",
           "cluster": "cluster"}  # --by key -> column (archive_jobs and the roll-up)


def details(conn: Connection, jobids: Sequence[str], cluster: str | None = None
            ) -> dict[str, list[tuple[JobDetail, float]]]:
    """The archived jobs with these ids (one per cluster), with when each was archived;
    two queries whatever their number."""
    where = [jobs.c.jobid.in_(list(jobids))]
    gwhere = [gpus.c.jobid.in_(list(jobids))]
    if cluster is not None:
        where.append(jobs.c.cluster == cluster)
        gwhere.append(gpus.c.cluster == cluster)
    rows = conn.execute(select(jobs).where(*where)).mappings().all()
    grows = conn.execute(select(gpus).where(*gwhere)).mappings().all()
    gpus_of: dict[tuple[str, str], list[Any]] = {}
    for g in grows:
        gpus_of.setdefault((g["cluster"], g["jobid"]), []).append(g)
    found: dict[str, list[tuple[JobDetail, float]]] = {}
    for row in sorted(rows, key=lambda r: (r["jobid"], r["cluster"])):
        detail = detail_of(row, gpus_of.get((row["cluster"], row["jobid"]), []))
        found.setdefault(row["jobid"], []).append((detail, row["archived_at"]))
    return found


def ended_usage(conn: Connection, window: Window, user: str | None = None,
                account: str | None = None, partition: str | None = None,
                cluster: str | None = None) -> list[JobUsage]:
    """Jobs that ended in the window, with their whole-life usage (one query)."""
    where = [jobs.c.end_time >= window.start, jobs.c.end_time <= window.end]
    for column, value in ((jobs.c.username, user), (jobs.c.account, account),
                          (jobs.c.partition, partition), (jobs.c.cluster, cluster)):
        if value:
            where.append(column == value)
    rows = conn.execute(select(jobs).where(*where)).mappings().all()
    return [usage_of(row) for row in rows]


def usage(conn: Connection, window: Window, by: Sequence[str], cluster: str | None = None,
          by_month: bool = False) -> list[UsageGroup]:
    """Sums per group of the jobs that ended in the window; with ``by_month`` per group
    and month (``UsageGroup.month``). Whole months come from the roll-up, the edges of
    the window from the job rows: at most three queries, whatever the jobs."""
    months, edges = split(window)
    found: dict[tuple[tuple[str, ...], str], UsageGroup] = {}
    queries = []
    if months:
        t = usage_monthly.c
        queries.append(select(*[t[BY_KEYS[k]] for k in by], t.end_month, func.sum(t.jobs),
                              *[func.sum(t[name]) for name in SUMS])
                       .where(t.end_month.in_(months),
                              *([t.cluster == cluster] if cluster else []))
                       .group_by(*[t[BY_KEYS[k]] for k in by], t.end_month))
    for edge in edges:
        j = jobs.c
        queries.append(select(*[j[BY_KEYS[k]] for k in by], j.end_month, func.count(),
                              *[func.sum(func.coalesce(j[name], 0.0)) for name in SUMS])
                       .where(j.end_time >= edge.start, j.end_time < edge.end,
                              *([j.cluster == cluster] if cluster else []))
                       .group_by(*[j[BY_KEYS[k]] for k in by], j.end_month))
    n = len(by)
    for query in queries:
        for row in conn.execute(query):
            key = tuple(str(k) for k in row[:n])
            month = str(row[n]) if by_month else ""
            group = found.setdefault((key, month), UsageGroup(key=key, month=month))
            values = [float(v or 0) for v in row[n + 1:]]
            group.jobs += round(values[0])
            group.add(dict(zip(SUMS, values[1:], strict=True)))
    return [g for g in found.values() if g.jobs > 0]


def counts(conn: Connection) -> tuple[int, int]:
    """(job rows, GPU rows)."""
    return (conn.execute(select(func.count()).select_from(jobs)).scalar_one(),
            conn.execute(select(func.count()).select_from(gpus)).scalar_one())


def inconsistent(conn: Connection) -> list[str]:
    """Jobs whose GPU rows do not add up to the job row (none in a consistent store)."""
    per_job = (select(gpus.c.jobid, gpus.c.cluster, func.count().label("n"),
                      func.sum(gpus.c.allocated_s).label("allocated"))
               .group_by(gpus.c.jobid, gpus.c.cluster).subquery())
    query = (select(jobs.c.jobid).select_from(jobs.outerjoin(per_job, and_(
        per_job.c.jobid == jobs.c.jobid, per_job.c.cluster == jobs.c.cluster)))
        .where((func.coalesce(per_job.c.n, 0) != jobs.c.gpus)
               | (func.abs(func.coalesce(per_job.c.allocated, 0.0) - jobs.c.allocated_s)
                  > 1e-6 * (1 + jobs.c.allocated_s))))
    orphans = (select(gpus.c.jobid).select_from(gpus.outerjoin(jobs, and_(
        jobs.c.jobid == gpus.c.jobid, jobs.c.cluster == gpus.c.cluster)))
        .where(jobs.c.jobid.is_(None)))
    sums = [func.coalesce(func.sum(func.coalesce(jobs.c[name], 0.0)), 0.0) for name in SUMS]
    raw = (select(*[jobs.c[name] for name in GROUP], func.count(), *sums)
           .group_by(*[jobs.c[name] for name in GROUP]))
    bad = {*conn.execute(query).scalars(), *conn.execute(orphans).scalars()}
    truth = {tuple(r[:len(GROUP)]): tuple(r[len(GROUP):]) for r in conn.execute(raw)}
    rolled = {tuple(r[:len(GROUP)]): tuple(r[len(GROUP):])
              for r in conn.execute(select(usage_monthly).where(usage_monthly.c.jobs != 0))}
    for group in truth.keys() | rolled.keys():
        want, got = truth.get(group, ()), rolled.get(group, ())
        if len(want) != len(got) or any(abs(a - b) > 1e-6 * (1 + abs(a))
                                        for a, b in zip(want, got, strict=True)):
            bad.add(f"roll-up {'/'.join(group)}")
    return sorted(bad)
