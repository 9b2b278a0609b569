"""The job archive: an SQLite file by default, PostgreSQL by URL, through SQLAlchemy Core.

Writes are idempotent upserts, one transaction per batch: a job stored twice is one
row, and a later run replaces a row only with counters at least as large (a late
scrape), so no run can lose what an earlier one stored. A run killed at any point
leaves whole batches or nothing of a batch.

Every failure to reach the store is a ReportError with its own exit status:
unreachable (7), locked by another writer past the timeout (8), or made by a newer
version of this program (9); in each case nothing is written.

This module connects, checks the schema and holds the transactions; what is written is
``upsert.py``, what is read ``read.py``, the rows ``rows.py``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, event, text
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, SQLAlchemyError
from sqlalchemy.pool import NullPool

from slurm_gpu_exporter.report.archive import read as archive_read
from slurm_gpu_exporter.report.archive.rows import ArchiveRecord, gpu_rows_of, job_row
from slurm_gpu_exporter.report.archive.schema import SCHEMA_VERSION, migrate, read_version
from slurm_gpu_exporter.report.archive.upsert import upsert
from slurm_gpu_exporter.report.errors import ReportError
from slurm_gpu_exporter.report.figures.shapes import JobDetail, JobUsage
from slurm_gpu_exporter.report.figures.usage import UsageGroup
from slurm_gpu_exporter.report.figures.window import Window

log = logging.getLogger(__name__)

EXIT_STORE_UNREACHABLE = 7
EXIT_STORE_LOCKED = 8
EXIT_STORE_NEWER = 9


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


def _create_private(path: Path) -> None:
    """Make a new SQLite archive file owner-only (0600) whatever the umask: it names
    users and their jobs. SQLite gives its -wal and -shm files the database's mode."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        return
    try:
        os.fchmod(fd, 0o600)
    finally:
        os.close(fd)


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
                    _create_private(path)
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

    def store(self, records: Sequence[ArchiveRecord], archived_at: float) -> None:
        """Upsert one batch of jobs and their GPUs in one transaction."""
        if not records:
            return
        job_rows = [job_row(r, archived_at) for r in records]
        gpu_rows = [row for r in records for row in gpu_rows_of(r)]
        with self._transaction() as conn:
            self._check_schema(conn)  # a newer program may have upgraded it meanwhile
            upsert(conn, job_rows, gpu_rows)

    # -- reading (read.py) ---------------------------------------------------------

    def details(self, jobids: Sequence[str], cluster: str | None = None
                ) -> dict[str, list[tuple[JobDetail, float]]]:
        """The archived jobs with these ids (one per cluster), with when each was archived;
        two queries whatever their number."""
        with self._transaction() as conn:
            return archive_read.details(conn, jobids, cluster)

    def ended_usage(self, window: Window, user: str | None = None, account: str | None = None,
                    partition: str | None = None, cluster: str | None = None
                    ) -> list[JobUsage]:
        """Jobs that ended in the window, with their whole-life usage (one query)."""
        with self._transaction() as conn:
            return archive_read.ended_usage(conn, window, user, account, partition, cluster)

    def usage(self, window: Window, by: Sequence[str], cluster: str | None = None,
              by_month: bool = False) -> list[UsageGroup]:
        """Sums per group of the jobs that ended in the window (per month too with
        ``by_month``); at most three queries, whatever the jobs."""
        with self._transaction() as conn:
            return archive_read.usage(conn, window, by, cluster, by_month)

    def counts(self) -> tuple[int, int]:
        """(job rows, GPU rows)."""
        with self._transaction() as conn:
            return archive_read.counts(conn)

    def inconsistent(self) -> list[str]:
        """Jobs whose GPU rows do not add up to the job row (none in a consistent store)."""
        with self._transaction() as conn:
            return archive_read.inconsistent(conn)
