"""The job archive's tables (SQLAlchemy Core) and the migrations between schema versions.

One row per job in ``archive_jobs`` and one per job, node and GPU in ``archive_gpus``;
``archive_meta`` holds the schema version. Column names avoid SQL keywords (``user``,
``end``) so a site's own SQL needs no quoting. Times are Unix seconds (UTC).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from sqlalchemy import (
    Column,
    Connection,
    Float,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    func,
    inspect,
    select,
    text,
)

from slurm_gpu_exporter.report.figures.table import Figure, archived

# The versions whose columns are written out below. A job figure added later
# (figures/table.py, ``since`` above this) gets its columns and its migration from its
# row: ``figure_columns``, ``_add_figures``.
SHIPPED_VERSION = 5

metadata = MetaData()

meta = Table(
    "archive_meta", metadata,
    Column("key", String(64), primary_key=True),
    Column("value", Text, nullable=False),
)

jobs = Table(
    "archive_jobs", metadata,
    Column("jobid", String(64), primary_key=True),
    Column("cluster", String(128), primary_key=True),
    Column("username", String(128), nullable=False),
    Column("account", String(128), nullable=False),
    Column("partition", String(128), nullable=False),
    Column("job_name", Text, nullable=False),
    Column("nodes", Text, nullable=False),  # JSON: [{node, cpus, cpu_s, memory_peak, ...}]
    Column("node_count", Integer, nullable=False),
    Column("gpus", Integer, nullable=False),
    Column("gpu_model", Text, nullable=False),
    Column("start_time", Float),
    Column("end_time", Float),
    Column("end_month", String(7), nullable=False),  # YYYY-MM of end_time (UTC)
    Column("state", String(64), nullable=False),
    Column("exit_code", String(32), nullable=False),
    Column("qos", String(128), nullable=False),
    Column("time_limit_s", Float),
    Column("cpus", Integer),
    Column("requested_memory", Float),
    Column("requested_gpus", Integer),
    Column("allocated_s", Float, nullable=False),
    Column("busy_s", Float, nullable=False),
    Column("sm_active_s", Float),
    Column("gpm_allocated_s", Float, nullable=False),
    Column("tensor_active_s", Float),  # version 2 on
    Column("dram_active_s", Float),
    Column("idle_gpus", Integer, nullable=False),
    Column("gpu_memory_peak", Float),
    Column("energy_j", Float),
    Column("cpu_s", Float),
    Column("cpu_efficiency", Float),
    Column("memory_peak", Float),
    Column("notes", Text, nullable=False),  # JSON list of the notes that fired
    Column("archived_at", Float, nullable=False),
    Column("cpu_energy_j", Float),  # version 3 on: the job's CPU and DRAM share (RAPL)
    Column("emissions_g", Float),  # gCO2e of GPU + CPU energy, at the factor when archived
    # version 4 on: the array task as the agent labelled it, "" for a plain job (and in
    # rows archived before)
    Column("array_job_id", String(16), nullable=False, server_default=""),
    Column("array_task_id", String(16), nullable=False, server_default=""),
    # version 5 on: what slowed the GPUs and what went wrong on them (NULL in rows
    # archived before, or from agents that did not count them)
    Column("throttled", Text),  # JSON: {reason: seconds}, the job's GPUs summed
    Column("xid_errors", Float),
    Column("gpu_errors", Text),  # JSON: {"xid:79": n, "ecc:uncorrected": n, ...}
)

gpus = Table(
    "archive_gpus", metadata,
    Column("jobid", String(64), primary_key=True),
    Column("cluster", String(128), primary_key=True),
    Column("node", String(255), primary_key=True),
    Column("gpu", String(32), primary_key=True),
    Column("uuid", String(128), nullable=False),
    Column("model", Text, nullable=False),
    Column("allocated_s", Float, nullable=False),
    Column("busy_s", Float, nullable=False),
    Column("sm_active_s", Float),
    Column("memory_peak", Float),
    Column("memory_total", Float),
    Column("energy_j", Float),
    Column("tensor_active_s", Float),  # version 2 on
    Column("dram_active_s", Float),
    Column("throttled", Text),  # version 5 on: JSON {reason: seconds}
    Column("gpu_errors", Text),  # JSON [{kind, detail, count, last}]
)

# What `usage` reads for whole months: the sums of archive_jobs per group and month of
# the end, kept in the same transaction as the rows (rollup.py).
usage_monthly = Table(
    "archive_usage_monthly", metadata,
    Column("cluster", String(128), primary_key=True),
    Column("account", String(128), primary_key=True),
    Column("username", String(128), primary_key=True),
    Column("partition", String(128), primary_key=True),
    Column("end_month", String(7), primary_key=True),
    Column("jobs", Integer, nullable=False),
    Column("allocated_s", Float, nullable=False),
    Column("busy_s", Float, nullable=False),
    Column("sm_active_s", Float, nullable=False),
    Column("gpm_allocated_s", Float, nullable=False),
    Column("energy_j", Float, nullable=False),
    Column("cpu_s", Float, nullable=False),
    Column("tensor_active_s", Float, nullable=False, server_default="0"),  # version 3 on
    Column("dram_active_s", Float, nullable=False, server_default="0"),
    Column("cpu_energy_j", Float, nullable=False, server_default="0"),
    Column("emissions_g", Float, nullable=False, server_default="0"),
)



def figure_columns(fig: Figure) -> list[tuple[Table, str]]:
    """The (table, column) pairs of a figure the archive keeps."""
    return [(table, column) for table, column in (
        (jobs, fig.job_column), (gpus, fig.gpu_column),
        (usage_monthly, fig.job_column if fig.rollup else "")) if column]


def _declare_new_figures() -> None:
    """The columns of the figures added after SHIPPED_VERSION, at the tables' ends."""
    for fig in archived():
        if fig.since <= SHIPPED_VERSION:
            continue
        for table, column in figure_columns(fig):
            table.append_column(
                Column(column, Float, nullable=False, server_default="0")
                if table is usage_monthly else Column(column, Float))


_declare_new_figures()
# Covers what `usage` sums: a year of a million jobs is read from this index alone, not
# from the rows (which carry the nodes and notes). Its first column serves every window.
USAGE_INDEX = Index(
    "archive_jobs_usage", jobs.c.end_time, jobs.c.cluster, jobs.c.account, jobs.c.username,
    jobs.c.partition, jobs.c.end_month, jobs.c.allocated_s, jobs.c.busy_s, jobs.c.sm_active_s,
    jobs.c.gpm_allocated_s, jobs.c.energy_j, jobs.c.cpu_s,
    jobs.c.tensor_active_s, jobs.c.dram_active_s, jobs.c.cpu_energy_j, jobs.c.emissions_g,
    *[jobs.c[f.job_column] for f in archived() if f.rollup and f.since > SHIPPED_VERSION])

# Migration N (index N - 1) brings a store from version N - 1 to N. Never edit one that
# shipped: add the next. The first makes the tables as defined above.
Migration = Callable[[Connection], None]


# Columns added after version 1: (table, column). A nullable one is NULL in old rows
# (not measured); a roll-up sum is NOT NULL, 0 until the roll-up is rebuilt.
ADDED_IN_V2 = [(jobs, "tensor_active_s"), (jobs, "dram_active_s"), (gpus, "tensor_active_s"),
               (gpus, "dram_active_s")]
ADDED_IN_V3 = [(jobs, "cpu_energy_j"), (jobs, "emissions_g"),
               (usage_monthly, "tensor_active_s"), (usage_monthly, "dram_active_s"),
               (usage_monthly, "cpu_energy_j"), (usage_monthly, "emissions_g")]
ADDED_IN_V4 = [(jobs, "array_job_id"), (jobs, "array_task_id")]
ADDED_IN_V5 = [(jobs, "throttled"), (jobs, "xid_errors"), (jobs, "gpu_errors"),
               (gpus, "throttled"), (gpus, "gpu_errors")]


def _create_v1(conn: Connection) -> None:
    # Today's tables: the later migrations find their columns there already.
    metadata.create_all(conn, tables=[jobs, gpus, usage_monthly])


def _add_columns(conn: Connection, added: list[tuple[Table, str]]) -> None:
    """Add the (table, column) pairs a store lacks, as their tables define them: a
    float (the archive's figures), a JSON text (NULL where not known), or a short text
    that is "" where not known."""
    have = {t.name: {c["name"] for c in inspect(conn).get_columns(t.name)}
            for t in {table for table, _ in added}}
    for table, column in added:
        if column in have[table.name]:
            continue
        kind = table.c[column].type
        if isinstance(kind, Text):  # before String: Text is one
            sql = "TEXT"
        elif isinstance(kind, String):
            sql = f"VARCHAR({kind.length}) NOT NULL DEFAULT ''"
        else:
            sql = "DOUBLE PRECISION" + ("" if table.c[column].nullable
                                        else " NOT NULL DEFAULT 0")
        conn.execute(text(f"ALTER TABLE {table.name} ADD COLUMN {column} {sql}"))


def _add_activity_v2(conn: Connection) -> None:
    """Tensor-core and DRAM activity (GPM) per job and GPU; old rows keep NULL."""
    _add_columns(conn, ADDED_IN_V2)


def _add_energy_v3(conn: Connection) -> None:
    """CPU energy and emissions per job; the roll-up sums them and the tensor and DRAM
    activity, rebuilt from the job rows (its old rows had none of the four)."""
    _add_columns(conn, ADDED_IN_V3)
    # The covering index gains what `usage` now sums, so the window's edges still read
    # the index alone.
    conn.execute(text(f"DROP INDEX IF EXISTS {USAGE_INDEX.name}"))
    USAGE_INDEX.create(conn)
    rebuild_rollup(conn)


def rebuild_rollup(conn: Connection) -> None:
    """The roll-up made afresh from the job rows, in the caller's transaction."""
    group = ["cluster", "account", "username", "partition", "end_month"]
    sums = [c.name for c in usage_monthly.c if c.name not in group and c.name != "jobs"]
    conn.execute(usage_monthly.delete())
    query = (select(*[jobs.c[name] for name in group], func.count(),
                    *[func.coalesce(func.sum(func.coalesce(jobs.c[name], 0.0)), 0.0)
                      for name in sums])
             .group_by(*[jobs.c[name] for name in group]))
    conn.execute(usage_monthly.insert().from_select([*group, "jobs", *sums], query))


def _add_array_task_v4(conn: Connection) -> None:
    """Each job's array task (array id, task id), so the reports show it as ``1234_5``;
    old rows keep "": their bare id."""
    _add_columns(conn, ADDED_IN_V4)


def _add_gpu_events_v5(conn: Connection) -> None:
    """Throttled time by reason and GPU errors per job and GPU; old rows keep NULL (not
    counted), and the roll-up sums none of them."""
    _add_columns(conn, ADDED_IN_V5)


def added_in(version: int) -> list[tuple[Table, str]]:
    """The (table, column) pairs that version ``version`` (2 on) added."""
    shipped = {2: ADDED_IN_V2, 3: ADDED_IN_V3, 4: ADDED_IN_V4, 5: ADDED_IN_V5}
    if version in shipped:
        return shipped[version]
    return [pair for fig in archived() if fig.since == version for pair in figure_columns(fig)]


def _add_figures(version: int, conn: Connection) -> None:
    """The columns of the job figures that came with ``version`` (figures/table.py); old
    rows keep NULL (not measured). A summed one joins the covering index and the
    roll-up, rebuilt from the job rows."""
    added = added_in(version)
    _add_columns(conn, added)
    if any(table is usage_monthly for table, _ in added):
        conn.execute(text(f"DROP INDEX IF EXISTS {USAGE_INDEX.name}"))
        USAGE_INDEX.create(conn)
        rebuild_rollup(conn)


MIGRATIONS: list[Migration] = [
    _create_v1, _add_activity_v2, _add_energy_v3, _add_array_task_v4, _add_gpu_events_v5,
    *[partial(_add_figures, version) for version in
      range(SHIPPED_VERSION + 1, max(f.since for f in archived()) + 1)]]
SCHEMA_VERSION = len(MIGRATIONS)


def read_version(conn: Connection) -> int:
    """The store's schema version; 0 for a store without tables."""
    # Asking the catalogue, not failing a SELECT: a failed statement ends a PostgreSQL
    # transaction.
    if not inspect(conn).has_table(meta.name):
        return 0
    value = conn.execute(select(meta.c.value).where(meta.c.key == "schema_version")
                         ).scalar_one_or_none()
    return int(value) if value is not None else 0


def migrate(conn: Connection, current: int) -> None:
    """Run the migrations from ``current`` to SCHEMA_VERSION in the caller's transaction."""
    if current == 0:
        metadata.create_all(conn, tables=[meta])
    for step in MIGRATIONS[current:]:
        step(conn)
    if current == 0:
        conn.execute(meta.insert().values(key="schema_version", value=str(SCHEMA_VERSION)))
    else:
        conn.execute(meta.update().where(meta.c.key == "schema_version")
                     .values(value=str(SCHEMA_VERSION)))
