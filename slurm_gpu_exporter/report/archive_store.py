"""The job archive: an SQLite file by default, PostgreSQL by URL, through SQLAlchemy Core.

Writes are idempotent upserts, one transaction per batch: a job stored twice is one
row, and a later run replaces a row only with counters at least as large (a late
scrape), so no run can lose what an earlier one stored. A run killed at any point
leaves whole batches or nothing of a batch.

Every failure to reach the store is a ReportError with its own exit status:
unreachable (7), locked by another writer past the timeout (8), or made by a newer
version of this program (9); in each case nothing is written.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Connection,
    Engine,
    and_,
    case,
    create_engine,
    event,
    func,
    literal,
    select,
    text,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, SQLAlchemyError
from sqlalchemy.pool import NullPool

from slurm_gpu_exporter.report.archive_rollup import GROUP, SUMS, apply_change, job_sums, split
from slurm_gpu_exporter.report.archive_schema import (
    SCHEMA_VERSION,
    gpus,
    jobs,
    migrate,
    read_version,
    usage_monthly,
)
from slurm_gpu_exporter.report.errors import ReportError
from slurm_gpu_exporter.report.model import (
    Accounting,
    GpuDetail,
    JobDetail,
    JobUsage,
    NodeDetail,
    UsageGroup,
)
from slurm_gpu_exporter.report.window import Window

log = logging.getLogger(__name__)

EXIT_STORE_UNREACHABLE = 7
EXIT_STORE_LOCKED = 8
EXIT_STORE_NEWER = 9
DEFAULT_DB = "sqlite:////var/lib/slurm-gpu-report/archive.sqlite"
BY_KEYS = {"account": "account", "user": "username", "partition": "partition",
           "cluster": "cluster"}  # --by key -> column (archive_jobs and the roll-up)
# Counters only grow: a later run keeps the larger of the stored and the new value.
JOB_COUNTERS = ("allocated_s", "busy_s", "sm_active_s", "gpm_allocated_s", "energy_j",
                "cpu_s", "gpu_memory_peak", "memory_peak")
GPU_COUNTERS = ("allocated_s", "busy_s", "sm_active_s", "energy_j", "memory_peak")
# What only Slurm accounting knows: a run without sacct keeps what an earlier one stored.
JOB_ACCOUNTING_TEXT = ("state", "exit_code", "qos")
JOB_ACCOUNTING_NUMBERS = ("time_limit_s", "requested_memory", "requested_gpus", "cpus",
                          "start_time", "end_time")


@dataclass
class ArchiveRecord:
    """One ended job as the archive stores it: its detail and its GPUs' models."""

    detail: JobDetail
    gpu_models: dict[tuple[str, str], str] = field(default_factory=dict)  # (node, gpu)


def parse_db_url(url: str) -> URL:
    """``sqlite:///PATH`` or ``postgresql://…`` (driven by psycopg); ReportError otherwise."""
    try:
        parsed = make_url(url)
    except ArgumentError:
        parsed = None
    if parsed is None or parsed.drivername not in ("sqlite", "postgresql",
                                                   "postgresql+psycopg"):
        raise ReportError(f"bad --db {url!r}: use sqlite:///PATH or "
                          "postgresql://USER@HOST/DATABASE")
    if parsed.drivername == "sqlite" and not parsed.database:
        raise ReportError("bad --db: give the SQLite file as sqlite:///PATH, e.g. sqlite:////var/lib/"
                          "slurm-gpu-report/archive.sqlite")
    if parsed.drivername == "postgresql":
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed


def shown(url: URL) -> str:
    """The URL for messages: no password."""
    return url.render_as_string(hide_password=True).replace("postgresql+psycopg", "postgresql")


def _failure(exc: Exception, where: str) -> ReportError:
    """A store error as one line with its exit status."""
    orig = getattr(exc, "orig", None) or exc
    message = str(orig).strip().splitlines()[0] if str(orig).strip() else type(orig).__name__
    sqlstate = getattr(orig, "sqlstate", None)
    if "database is locked" in message or "database is busy" in message or sqlstate == "55P03":
        return ReportError(f"the archive {where} is locked by another writer ({message}); "
                           "retry when that run ends, or raise --db-timeout",
                           EXIT_STORE_LOCKED)
    return ReportError(f"cannot use the archive {where}: {message}; check --db and that "
                       "the database runs", EXIT_STORE_UNREACHABLE)


class ArchiveStore:
    """The archive at one URL; open with ``ArchiveStore(url, write=…)`` and ``with``."""

    def __init__(self, url: str, write: bool, timeout_s: float = 10.0) -> None:
        self.url = parse_db_url(url)
        self.where = shown(self.url)
        self.write = write
        self.timeout_s = timeout_s
        self.engine = self._engine()

    def __enter__(self) -> ArchiveStore:
        self._check_schema()
        return self

    def __exit__(self, *exc: object) -> None:
        self.engine.dispose()

    # -- connecting -------------------------------------------------------------------

    def _engine(self) -> Engine:
        if self.url.get_backend_name() == "sqlite":
            path = Path(self.url.database or "")
            if not self.write and not path.exists():
                raise ReportError(f"no archive at {path}: run `slurm-gpu-report archive` "
                                  "first, or point --db at it", EXIT_STORE_UNREACHABLE)
            if self.write:
                try:
                    path.parent.mkdir(parents=True, exist_ok=True)
                except OSError as exc:
                    raise ReportError(f"cannot make {path.parent} for the archive: "
                                      f"{exc.strerror}; create it or choose --db",
                                      EXIT_STORE_UNREACHABLE) from None
            engine = create_engine(self.url, poolclass=NullPool,
                                   connect_args={"timeout": self.timeout_s})
            begin = "BEGIN IMMEDIATE" if self.write else "BEGIN"

            @event.listens_for(engine, "connect")
            def _connect(dbapi_conn: Any, _record: Any) -> None:
                # Our own BEGIN (below), not the driver's: a writer takes the lock at
                # the start of its transaction, where the busy timeout applies.
                dbapi_conn.isolation_level = None
                if self.write:
                    dbapi_conn.execute("PRAGMA journal_mode=WAL")
                    dbapi_conn.execute("PRAGMA synchronous=NORMAL")

            @event.listens_for(engine, "begin")
            def _begin(conn: Connection) -> None:
                conn.exec_driver_sql(begin)

            return engine
        lock_ms = max(1, int(self.timeout_s * 1000))
        return create_engine(self.url, poolclass=NullPool, connect_args={
            "connect_timeout": max(1, round(self.timeout_s)),
            "options": f"-c lock_timeout={lock_ms}"})

    @contextmanager
    def _transaction(self) -> Iterator[Connection]:
        try:
            with self.engine.begin() as conn:
                yield conn
        except (DBAPIError, SQLAlchemyError) as exc:
            raise _failure(exc, self.where) from None

    def _check_schema(self, conn: Connection | None = None) -> None:
        if conn is None:
            with self._transaction() as own:
                self._check_schema(own)
            return
        if self.write and self.engine.dialect.name == "postgresql":
            conn.execute(text("SELECT pg_advisory_xact_lock(72126021)"))  # one migrator
        version = read_version(conn)
        if version > SCHEMA_VERSION:
            raise ReportError(f"the archive {self.where} has schema version {version}, newer "
                              f"than this slurm-gpu-report knows ({SCHEMA_VERSION}); upgrade "
                              "slurm-gpu-report", EXIT_STORE_NEWER)
        if version < SCHEMA_VERSION:
            if not self.write:
                raise ReportError(f"the archive {self.where} is empty or of an older schema "
                                  f"({version}): run `slurm-gpu-report archive` once",
                                  EXIT_STORE_UNREACHABLE)
            migrate(conn, version)
            log.info("archive %s: schema %d -> %d", self.where, version, SCHEMA_VERSION)

    # -- writing ----------------------------------------------------------------------

    def _greatest(self, a: Any, b: Any) -> ColumnElement[Any]:
        a, b = func.coalesce(a, b), func.coalesce(b, a)
        # SQLite's two-argument max() is PostgreSQL's greatest().
        return func.max(a, b) if self.engine.dialect.name == "sqlite" else func.greatest(a, b)

    def _insert(self, table: Any) -> Any:
        module = sqlite if self.engine.dialect.name == "sqlite" else postgresql
        return module.insert(table)

    def _job_upsert(self) -> Any:
        stmt = self._insert(jobs)
        new, old = stmt.excluded, jobs.c
        keys = {"jobid", "cluster"}
        set_: dict[str, Any] = {c.name: new[c.name] for c in jobs.c if c.name not in keys}
        for name in JOB_COUNTERS:
            set_[name] = self._greatest(old[name], new[name])
        for name in JOB_ACCOUNTING_TEXT:
            set_[name] = case((new[name] != literal(""), new[name]), else_=old[name])
        for name in JOB_ACCOUNTING_NUMBERS:
            set_[name] = func.coalesce(new[name], old[name])
        return stmt.on_conflict_do_update(
            index_elements=[jobs.c.jobid, jobs.c.cluster], set_=set_,
            where=and_(new.allocated_s >= old.allocated_s, new.busy_s >= old.busy_s))

    def _gpu_upsert(self) -> Any:
        stmt = self._insert(gpus)
        new, old = stmt.excluded, gpus.c
        keys = [gpus.c.jobid, gpus.c.cluster, gpus.c.node, gpus.c.gpu]
        set_: dict[str, Any] = {"uuid": new.uuid, "model": new.model,
                                "memory_total": func.coalesce(new.memory_total,
                                                              old.memory_total)}
        for name in GPU_COUNTERS:
            set_[name] = self._greatest(old[name], new[name])
        return stmt.on_conflict_do_update(index_elements=keys, set_=set_,
                                          where=new.allocated_s >= old.allocated_s)

    def store(self, records: Sequence[ArchiveRecord], archived_at: float) -> None:
        """Upsert one batch of jobs and their GPUs in one transaction."""
        if not records:
            return
        job_rows = [job_row(r, archived_at) for r in records]
        gpu_rows = [row for r in records for row in gpu_rows_of(r)]
        keys = list(dict.fromkeys((row["jobid"], row["cluster"]) for row in job_rows))
        with self._transaction() as conn:
            self._check_schema(conn)  # a newer program may have upgraded it meanwhile
            before = job_sums(conn, keys)
            conn.execute(self._job_upsert(), job_rows)
            if gpu_rows:
                conn.execute(self._gpu_upsert(), gpu_rows)
            apply_change(conn, before, job_sums(conn, keys), self._insert)

    # -- reading ----------------------------------------------------------------------

    def details(self, jobids: Sequence[str], cluster: str | None = None
                ) -> dict[str, list[tuple[JobDetail, float]]]:
        """The archived jobs with these ids (one per cluster), with when each was archived;
        two queries whatever their number."""
        where = [jobs.c.jobid.in_(list(jobids))]
        gwhere = [gpus.c.jobid.in_(list(jobids))]
        if cluster is not None:
            where.append(jobs.c.cluster == cluster)
            gwhere.append(gpus.c.cluster == cluster)
        with self._transaction() as conn:
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

    def ended_usage(self, window: Window, user: str | None = None, account: str | None = None,
                    partition: str | None = None, cluster: str | None = None
                    ) -> list[JobUsage]:
        """Jobs that ended in the window, with their whole-life usage (one query)."""
        where = [jobs.c.end_time >= window.start, jobs.c.end_time <= window.end]
        for column, value in ((jobs.c.username, user), (jobs.c.account, account),
                              (jobs.c.partition, partition), (jobs.c.cluster, cluster)):
            if value:
                where.append(column == value)
        with self._transaction() as conn:
            rows = conn.execute(select(jobs).where(*where)).mappings().all()
        return [usage_of(row) for row in rows]

    def usage(self, window: Window, by: Sequence[str], cluster: str | None = None,
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
        with self._transaction() as conn:
            for query in queries:
                for row in conn.execute(query):
                    key = tuple(str(k) for k in row[:n])
                    month = str(row[n]) if by_month else ""
                    group = found.setdefault((key, month), UsageGroup(key=key, month=month))
                    values = [float(v or 0) for v in row[n + 1:]]
                    group.jobs += round(values[0])
                    group.allocated_s += values[1]
                    group.busy_s += values[2]
                    group.sm_active_s += values[3]
                    group.gpm_allocated_s += values[4]
                    group.energy_j += values[5]
                    group.cpu_s += values[6]
        return [g for g in found.values() if g.jobs > 0]

    def counts(self) -> tuple[int, int]:
        """(job rows, GPU rows)."""
        with self._transaction() as conn:
            return (conn.execute(select(func.count()).select_from(jobs)).scalar_one(),
                    conn.execute(select(func.count()).select_from(gpus)).scalar_one())

    def inconsistent(self) -> list[str]:
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
        with self._transaction() as conn:
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


# --- rows <-> report model -----------------------------------------------------------


def month_of(t: float | None) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m") if t is not None else ""


def job_row(record: ArchiveRecord, archived_at: float) -> dict[str, Any]:
    """The ``archive_jobs`` row of one job."""
    d = record.detail
    u, acct = d.usage, d.accounting or Accounting()
    models = sorted(set(record.gpu_models.values()) - {""})
    return {
        "jobid": u.jobid, "cluster": u.cluster, "username": u.user,
        "account": u.account or acct.account, "partition": u.partition, "job_name": u.name,
        "nodes": json.dumps([{"node": n.node, "cpus": n.cpus, "cpu_s": n.cpu_s,
                              "memory_peak": n.memory_peak, "memory_limit": n.memory_limit}
                             for n in d.nodes]),
        "node_count": len(d.nodes), "gpus": sum(len(n.gpus) for n in d.nodes),
        "gpu_model": ",".join(models), "start_time": d.start, "end_time": d.end,
        "end_month": month_of(d.end), "state": acct.state, "exit_code": acct.exit_code,
        "qos": acct.qos, "time_limit_s": acct.time_limit_s, "cpus": d.cpus,
        "requested_memory": d.memory_request, "requested_gpus": acct.requested_gpus,
        "allocated_s": u.allocated_s, "busy_s": u.busy_s, "sm_active_s": u.sm_active_s,
        "gpm_allocated_s": u.gpm_allocated_s, "idle_gpus": u.idle_gpus,
        "gpu_memory_peak": u.gpu_memory_peak, "energy_j": d.energy_j,
        "cpu_s": _sum([n.cpu_s for n in d.nodes]), "cpu_efficiency": d.cpu_efficiency,
        "memory_peak": d.memory_peak, "notes": json.dumps(d.notes), "archived_at": archived_at,
    }


def _sum(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def gpu_rows_of(record: ArchiveRecord) -> list[dict[str, Any]]:
    """The ``archive_gpus`` rows of one job."""
    u = record.detail.usage
    return [{"jobid": u.jobid, "cluster": u.cluster, "node": n.node, "gpu": g.gpu,
             "uuid": g.uuid, "model": record.gpu_models.get((n.node, g.gpu), ""),
             "allocated_s": g.allocated_s, "busy_s": g.busy_s, "sm_active_s": g.sm_active_s,
             "memory_peak": g.memory_peak, "memory_total": g.memory_total,
             "energy_j": g.energy_j}
            for n in record.detail.nodes for g in n.gpus]


def usage_of(row: Any) -> JobUsage:
    """A job row as the usage the reports read."""
    return JobUsage(
        jobid=row["jobid"], user=row["username"], account=row["account"],
        partition=row["partition"], name=row["job_name"], cluster=row["cluster"],
        gpus=row["gpus"], allocated_s=row["allocated_s"], busy_s=row["busy_s"],
        idle_gpus=row["idle_gpus"], gpu_memory_peak=row["gpu_memory_peak"],
        start=row["start_time"], end=row["end_time"], sm_active_s=row["sm_active_s"],
        gpm_allocated_s=row["gpm_allocated_s"])


def detail_of(row: Any, gpu_rows: list[Any]) -> JobDetail:
    """A job row and its GPU rows as the detail ``job`` renders."""
    nodes = [NodeDetail(node=n["node"], cpus=n["cpus"], cpu_s=n["cpu_s"],
                        memory_peak=n["memory_peak"], memory_limit=n["memory_limit"])
             for n in json.loads(row["nodes"])]
    by_node = {n.node: n for n in nodes}
    for g in sorted(gpu_rows, key=lambda g: (g["node"], _gpu_order(g["gpu"]))):
        node = by_node.get(g["node"])
        if node is None:
            node = by_node[g["node"]] = NodeDetail(node=g["node"])
            nodes.append(node)
        node.gpus.append(GpuDetail(
            gpu=g["gpu"], uuid=g["uuid"], allocated_s=g["allocated_s"], busy_s=g["busy_s"],
            memory_peak=g["memory_peak"], memory_total=g["memory_total"],
            energy_j=g["energy_j"], sm_active_s=g["sm_active_s"]))
    accounting = Accounting(
        state=row["state"], time_limit_s=row["time_limit_s"],
        requested_memory=row["requested_memory"], cpus=row["cpus"], nodes=row["node_count"],
        start=row["start_time"], end=row["end_time"], exit_code=row["exit_code"],
        account=row["account"], qos=row["qos"], requested_gpus=row["requested_gpus"])
    return JobDetail(usage=usage_of(row), nodes=nodes, accounting=accounting,
                     now=row["archived_at"], notes=json.loads(row["notes"]))


def _gpu_order(gpu: str) -> tuple[int, ...]:
    return tuple(int(p) if p.isdigit() else 0 for p in gpu.split("."))
