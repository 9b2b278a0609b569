"""Writing the job archive: one batch of jobs and their GPUs as idempotent upserts that
only let counters grow, and the monthly roll-up moved by what the batch changed."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import ColumnElement, Connection, and_, case, func, literal
from sqlalchemy.dialects import postgresql, sqlite

from slurm_gpu_exporter.report.archive.rollup import apply_change, job_sums
from slurm_gpu_exporter.report.archive.schema import gpus, jobs
from slurm_gpu_exporter.report.figures.table import archived

# Counters and peaks only grow: a later run keeps the larger of the stored and the new
# value. The job figures' columns (figures/table.py; not the start and end times, which
# Slurm accounting may fill) and the job's own derived sums.
_GROWING = tuple(f for f in archived()
                 if f.shape in ("counter", "peak") and f.unit != "unix seconds")
JOB_COUNTERS = (*(f.job_column for f in _GROWING if f.job_column), "gpm_allocated_s",
                "xid_errors")
GPU_COUNTERS = tuple(f.gpu_column for f in _GROWING if f.gpu_column)
# A device's figure (the GPU's memory): the later run's, where it has one.
GPU_DEVICE = tuple(f.gpu_column for f in archived() if f.shape == "device" and f.gpu_column)
# What only Slurm accounting knows: a run without sacct keeps what an earlier one stored.
JOB_ACCOUNTING_TEXT = ("state", "exit_code", "qos")
# Known once, kept: a later run that saw no array labels does not forget the task.
JOB_LABEL_TEXT = ("array_job_id", "array_task_id")
JOB_ACCOUNTING_NUMBERS = ("time_limit_s", "requested_memory", "requested_gpus", "cpus",
                          "start_time", "end_time")


def _greatest(dialect: str, a: Any, b: Any) -> ColumnElement[Any]:
    a, b = func.coalesce(a, b), func.coalesce(b, a)
    # SQLite's two-argument max() is PostgreSQL's greatest().
    return func.max(a, b) if dialect == "sqlite" else func.greatest(a, b)


def _inserter(dialect: str) -> Any:
    """The dialect's ``insert``, the one with ``on_conflict_do_update``."""
    return (sqlite if dialect == "sqlite" else postgresql).insert


def _job_upsert(dialect: str) -> Any:
    stmt = _inserter(dialect)(jobs)
    new, old = stmt.excluded, jobs.c
    keys = {"jobid", "cluster"}
    set_: dict[str, Any] = {c.name: new[c.name] for c in jobs.c if c.name not in keys}
    for name in JOB_COUNTERS:
        set_[name] = _greatest(dialect, old[name], new[name])
    for name in (*JOB_ACCOUNTING_TEXT, *JOB_LABEL_TEXT):
        set_[name] = case((new[name] != literal(""), new[name]), else_=old[name])
    for name in (*JOB_ACCOUNTING_NUMBERS, "throttled", "gpu_errors"):
        set_[name] = func.coalesce(new[name], old[name])
    return stmt.on_conflict_do_update(
        index_elements=[jobs.c.jobid, jobs.c.cluster], set_=set_,
        where=and_(new.allocated_s >= old.allocated_s, new.busy_s >= old.busy_s))


def _gpu_upsert(dialect: str) -> Any:
    stmt = _inserter(dialect)(gpus)
    new, old = stmt.excluded, gpus.c
    keys = [gpus.c.jobid, gpus.c.cluster, gpus.c.node, gpus.c.gpu]
    set_: dict[str, Any] = {"uuid": new.uuid, "model": new.model,
                            **{name: func.coalesce(new[name], old[name])
                               for name in GPU_DEVICE}}
    for name in GPU_COUNTERS:
        set_[name] = _greatest(dialect, old[name], new[name])
    for name in ("throttled", "gpu_errors"):  # the later run's, where it has them
        set_[name] = func.coalesce(new[name], old[name])
    return stmt.on_conflict_do_update(index_elements=keys, set_=set_,
                                      where=new.allocated_s >= old.allocated_s)


def upsert(conn: Connection, job_rows: Sequence[dict[str, Any]],
           gpu_rows: Sequence[dict[str, Any]]) -> None:
    """Upsert job and GPU rows (``rows.job_row``, ``rows.gpu_rows_of``) and move the
    roll-up by what they changed, in the caller's transaction on ``conn``."""
    dialect = conn.dialect.name
    keys = list(dict.fromkeys((row["jobid"], row["cluster"]) for row in job_rows))
    before = job_sums(conn, keys)
    conn.execute(_job_upsert(dialect), job_rows)
    if gpu_rows:
        conn.execute(_gpu_upsert(dialect), gpu_rows)
    apply_change(conn, before, job_sums(conn, keys), _inserter(dialect))
