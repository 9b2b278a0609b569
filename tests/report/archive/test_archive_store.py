"""The job archive store, on SQLite and on a real PostgreSQL: idempotent upserts that only
grow counters, the schema version, and the one-line failures with their exit codes."""

from __future__ import annotations

import json
import os
import sqlite3
import stat
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
from sqlalchemy import create_engine, text

from slurm_gpu_exporter.report.archive.schema import SCHEMA_VERSION
from slurm_gpu_exporter.report.archive.store import (
    EXIT_STORE_LOCKED,
    EXIT_STORE_NEWER,
    EXIT_STORE_UNREACHABLE,
    ArchiveStore,
    parse_db_url,
)
from slurm_gpu_exporter.report.archive.usage import month_window, usage_report
from slurm_gpu_exporter.report.errors import ReportError
from slurm_gpu_exporter.report.figures.window import Window
from slurm_gpu_exporter.report.render.usage import render_usage
from tests.report.archive.archive_data import DEC_1, NOV_1, record
from tests.support import free_port

REPORT = str(Path(sys.executable).parent / "slurm-gpu-report")
# Prometheus is never reached in these runs: the store is checked first.
NO_PROMETHEUS = ("--prometheus-url", "http://127.0.0.1:9")


def report(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([REPORT, *args], capture_output=True, text=True, timeout=60,
                          check=False)


def _engine_url(url: str) -> str:
    return parse_db_url(url).render_as_string(hide_password=False)


def test_a_job_stored_twice_is_one_row_and_overlapping_batches_add_none(
        archive_url: str) -> None:
    with ArchiveStore(archive_url, write=True) as store:
        store.store([record("1"), record("2", gpus=4)], archived_at=NOV_1)
        store.store([record("2", gpus=4), record("3")], archived_at=NOV_1 + 900)
        store.store([record("1"), record("2", gpus=4), record("3")], archived_at=NOV_1 + 1800)
        assert store.counts() == (3, 2 + 4 + 2)
        assert store.inconsistent() == []


def test_a_later_run_replaces_a_row_only_with_larger_counters(archive_url: str) -> None:
    with ArchiveStore(archive_url, write=True) as store:
        store.store([record("7", hours=2.0, busy=0.5)], archived_at=NOV_1)
        # Part of the job's samples gone from Prometheus: smaller counters change nothing.
        store.store([record("7", hours=1.0, busy=0.2, state="FAILED")], archived_at=NOV_1 + 1)
        (detail, at), = store.details(["7"])["7"]
        assert detail.usage.allocated_s == 2 * 2 * 3600 and at == NOV_1
        assert detail.accounting is not None and detail.accounting.state == "COMPLETED"
        # A late scrape: larger counters replace them.
        store.store([record("7", hours=2.5, busy=0.6)], archived_at=NOV_1 + 2)
        (detail, at), = store.details(["7"])["7"]
        assert detail.usage.allocated_s == 2 * 2.5 * 3600 and at == NOV_1 + 2
        assert detail.usage.busy_ratio == pytest.approx(0.6)
        assert [g.allocated_s for g in detail.nodes[0].gpus] == [2.5 * 3600] * 2
        assert store.inconsistent() == []


def test_what_sacct_said_survives_a_later_run_without_sacct(archive_url: str) -> None:
    with ArchiveStore(archive_url, write=True) as store:
        store.store([record("8", state="TIMEOUT", exit_code="0:15")], archived_at=NOV_1)
        later = record("8", hours=1.5)
        later.detail.accounting = None
        store.store([later], archived_at=NOV_1 + 900)
        (detail, _), = store.details(["8"])["8"]
    assert detail.accounting is not None
    assert (detail.accounting.state, detail.accounting.exit_code) == ("TIMEOUT", "0:15")
    assert detail.accounting.time_limit_s == 7200
    assert detail.usage.allocated_s == 2 * 1.5 * 3600


def test_archived_job_reads_back_as_it_was_stored(archive_url: str) -> None:
    original = record("42", gpus=2, nodes=2, hours=3.0, busy=0.25).detail
    with ArchiveStore(archive_url, write=True) as store:
        store.store([record("42", gpus=2, nodes=2, hours=3.0, busy=0.25)], archived_at=NOV_1)
    with ArchiveStore(archive_url, write=False) as store:
        (detail, _), = store.details(["42", "missing"])["42"]
    assert detail.usage == original.usage
    assert [n.node for n in detail.nodes] == ["gpu00", "gpu01"]
    assert [[g.uuid for g in n.gpus] for n in detail.nodes] == [
        [g.uuid for g in n.gpus] for n in original.nodes]
    assert detail.cpu_efficiency == pytest.approx(original.cpu_efficiency)
    assert detail.energy_j == pytest.approx(original.energy_j)
    assert detail.notes == ["a note"]


def test_a_new_store_gets_the_current_schema_version(archive_url: str) -> None:
    with ArchiveStore(archive_url, write=True):
        pass
    engine = create_engine(_engine_url(archive_url))
    with engine.connect() as conn:
        version = conn.execute(text("SELECT value FROM archive_meta "
                                    "WHERE key = 'schema_version'")).scalar_one()
    engine.dispose()
    assert int(version) == SCHEMA_VERSION


def test_usage_sums_per_group_and_month(archive_url: str) -> None:
    with ArchiveStore(archive_url, write=True) as store:
        store.store([
            record("1", user="alice", account="physics", hours=1.0, busy=0.5),
            record("2", user="bob", account="physics", hours=2.0, busy=0.25),
            record("3", user="carol", account="chemistry", hours=1.0, busy=1.0,
                   end=DEC_1 + 3600),
            record("4", user="alice", account="physics", hours=0.5, busy=0.0,
                   end=NOV_1 - 3600),  # October
        ], archived_at=DEC_1 + 7200)
    with ArchiveStore(archive_url, write=False) as store:
        november = usage_report(store, month_window("2026-11", DEC_1 + 86400), ["account"])
        year = usage_report(store, Window(NOV_1 - 86400 * 30, DEC_1 + 86400),
                            ["account", "user"])
    (physics,) = november.groups
    assert physics.key == ("physics",) and physics.jobs == 2
    assert physics.gpu_hours == pytest.approx(2 * 1 + 2 * 2)
    assert physics.busy_ratio == pytest.approx((2 * 0.5 + 4 * 0.25) / 6)
    assert physics.wasted_gpu_hours == pytest.approx(6 - 2)
    assert physics.energy_kwh == pytest.approx(6 * 3600 * 300 / 3.6e6)
    assert physics.sm_active_gpu_hours == pytest.approx((2 * 0.5 + 4 * 0.25) / 2)
    assert november.months == []
    assert [g.key for g in year.groups] == [("physics", "bob"), ("physics", "alice"),
                                            ("chemistry", "carol")]
    assert [(m.month, m.jobs) for m in year.months] == [("2026-10", 1), ("2026-11", 2),
                                                        ("2026-12", 1)]
    data = json.loads(render_usage(year, "json"))
    assert data["groups"][0] == {**data["groups"][0], "account": "physics", "user": "bob",
                                 "jobs": 1}
    assert [m["month"] for m in data["months"]] == ["2026-10", "2026-11", "2026-12"]
    for fmt in ("table", "csv", "markdown", "html"):
        assert "carol" in render_usage(year, fmt) and "physics" in render_usage(november, fmt)
    assert render_usage(year, "csv").splitlines()[0].startswith("account,user,jobs,gpu_hours")


def test_usage_html_has_a_bar_per_group_a_month_trend_and_inert_names(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'a.sqlite'}"
    hostile = '<script>alert(1)</script>'
    with ArchiveStore(url, write=True) as store:
        store.store([record("1", user=hostile, end=NOV_1 + 10),
                     record("2", user="bob", end=DEC_1 + 10)], archived_at=DEC_1 + 60)
    with ArchiveStore(url, write=False) as store:
        page = render_usage(usage_report(store, Window(NOV_1, DEC_1 + 3600), ["user"]), "html")
    assert "<script>" not in page and "&lt;script&gt;" in page
    assert page.count('class="bar"') == 2 + 2 + 2  # held, busy, and one bar per month
    assert 'id="trend-by-month"' in page


def test_bad_db_urls_and_by_keys_are_one_line_errors() -> None:
    for url in ("mysql://x/y", "sqlite://", "nonsense"):
        with pytest.raises(ReportError) as err:
            parse_db_url(url)
        assert err.value.exit_code == 2 and "sqlite:///PATH" in str(err.value)
    with pytest.raises(ReportError, match="use one or more of account, user"):
        usage_report(None, Window(0, 1), ["project"])  # type: ignore[arg-type]


@pytest.mark.process
def test_a_store_of_a_newer_schema_is_refused_and_left_as_it_was(archive_url: str) -> None:
    with ArchiveStore(archive_url, write=True) as store:
        store.store([record("1")], archived_at=NOV_1)
    engine = create_engine(_engine_url(archive_url))
    with engine.begin() as conn:
        conn.execute(text("UPDATE archive_meta SET value = '99' WHERE key = 'schema_version'"))
    engine.dispose()
    got = report("archive", "--db", archive_url, *NO_PROMETHEUS)
    assert got.returncode == EXIT_STORE_NEWER, got.stderr
    assert len(got.stderr.strip().splitlines()) == 1
    assert "schema version 99, newer than this slurm-gpu-report knows" in got.stderr
    got = report("usage", "--by", "user", "--db", archive_url)
    assert got.returncode == EXIT_STORE_NEWER, got.stderr
    engine = create_engine(_engine_url(archive_url))
    with engine.connect() as conn:
        assert conn.execute(text("SELECT value FROM archive_meta")).scalar_one() == "99"
        assert conn.execute(text("SELECT count(*) FROM archive_jobs")).scalar_one() == 1
    engine.dispose()


@pytest.mark.process
def test_a_store_locked_by_another_writer_fails_with_its_own_exit_code(
        archive_url: str) -> None:
    with ArchiveStore(archive_url, write=True):
        pass
    if archive_url.startswith("sqlite"):
        holder = sqlite3.connect(parse_db_url(archive_url).database, isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")
        release = holder.rollback
    else:
        pg = psycopg.connect(archive_url)
        pg.execute("LOCK TABLE archive_meta, archive_jobs IN ACCESS EXCLUSIVE MODE")
        release = pg.rollback
    try:
        got = report("archive", "--db", archive_url, "--db-timeout", "0.5", *NO_PROMETHEUS)
    finally:
        release()
    assert got.returncode == EXIT_STORE_LOCKED, got.stderr
    assert len(got.stderr.strip().splitlines()) == 1
    assert "is locked by another writer" in got.stderr and "--db-timeout" in got.stderr


@pytest.mark.process
def test_an_unreachable_store_fails_with_its_own_exit_code_and_makes_nothing(
        tmp_path: Path) -> None:
    missing = tmp_path / "none.sqlite"
    got = report("usage", "--by", "user", "--db", f"sqlite:///{missing}")
    assert got.returncode == EXIT_STORE_UNREACHABLE and not missing.exists()
    assert got.stderr.count("\n") == 1 and "no archive at" in got.stderr
    closed = f"postgresql://postgres@127.0.0.1:{free_port()}/archive"
    got = report("archive", "--db", closed, "--db-timeout", "2", *NO_PROMETHEUS)
    assert got.returncode == EXIT_STORE_UNREACHABLE, got.stderr
    assert got.stderr.count("\n") == 1 and "cannot use the archive postgresql://" in got.stderr
    blocked = tmp_path / "file"
    blocked.write_text("")
    got = report("archive", "--db", f"sqlite:///{blocked}/sub/a.sqlite", *NO_PROMETHEUS)
    assert got.returncode == EXIT_STORE_UNREACHABLE and got.stderr.count("\n") == 1


def test_user_chosen_text_is_stored_as_text_never_as_sql(archive_url: str) -> None:
    hostile = "x'); DROP TABLE archive_jobs; --\" \\ %s ${x} \x1b[31m"
    job = record("66", user="eve")
    job.detail.usage.name = hostile
    job.detail.notes = [hostile]
    with ArchiveStore(archive_url, write=True) as store:
        store.store([job], archived_at=NOV_1)
        store.store([job], archived_at=NOV_1)
        (detail, _), = store.details([hostile, "66"])["66"]
        assert store.counts() == (1, 2)
    assert detail.usage.name == hostile and detail.notes == [hostile]


def test_the_monthly_roll_up_follows_upserts_as_the_job_rows_do(archive_url: str) -> None:
    month, shifted = Window(NOV_1, DEC_1), Window(NOV_1 - 3600, DEC_1 - 1)  # roll-up, rows
    with ArchiveStore(archive_url, write=True) as store:
        store.store([record("1", hours=1.0), record("2", user="bob")], archived_at=NOV_1)
        store.store([record("1", hours=3.0, busy=0.9), record("2", user="bob", hours=0.5)],
                    archived_at=NOV_1 + 1)  # one grew, one came late and smaller
        store.store([record("1", hours=3.0, busy=0.9)], archived_at=NOV_1 + 2)
        assert store.inconsistent() == []
        from_roll_up = {g.key: g for g in store.usage(month, ["user"])}
        from_rows = {g.key: g for g in store.usage(shifted, ["user"])}
    assert from_roll_up.keys() == from_rows.keys() == {("alice",), ("bob",)}
    for key, group in from_roll_up.items():
        assert (group.jobs, group.allocated_s, group.busy_s) == (
            from_rows[key].jobs, pytest.approx(from_rows[key].allocated_s),
            pytest.approx(from_rows[key].busy_s))
    assert from_roll_up[("alice",)].allocated_s == 2 * 3 * 3600
    assert from_roll_up[("bob",)].allocated_s == 2 * 1 * 3600


def test_a_new_sqlite_archive_and_its_wal_files_are_owner_only_under_umask_022(
        tmp_path: Path) -> None:
    """Issue 33: the archive made by hand under umask 022 was world-readable."""
    path = tmp_path / "new" / "archive.sqlite"
    old = os.umask(0o022)
    try:
        with ArchiveStore(f"sqlite:///{path}", write=True) as store:
            store.store([record("1")], archived_at=NOV_1)
        # While a writer holds it open, SQLite's -wal and -shm take the file's mode.
        held = sqlite3.connect(path)
        held.execute("PRAGMA journal_mode=WAL")
        held.execute("CREATE TABLE held (x)")
        modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in path.parent.iterdir()}
        held.close()
    finally:
        os.umask(old)
    assert set(modes) == {"archive.sqlite", "archive.sqlite-wal", "archive.sqlite-shm"}
    assert set(modes.values()) == {0o600}, modes
