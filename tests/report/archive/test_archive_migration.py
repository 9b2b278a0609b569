"""Archives of schema version 1 (before tensor and DRAM activity) and 2 (before CPU
energy and emissions) on SQLite and on a real PostgreSQL: read-only commands ask for one
`archive` run; a writer migrates it in place, the old rows keep their figures (the new
ones NULL: not measured), the roll-up is rebuilt from the rows and new rows store the
new figures."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from sqlalchemy import create_engine, inspect, text

from slurm_gpu_exporter.report.archive.schema import SCHEMA_VERSION, added_in
from slurm_gpu_exporter.report.archive.store import (
    EXIT_STORE_UNREACHABLE,
    ArchiveStore,
    parse_db_url,
)
from slurm_gpu_exporter.report.archive.usage import month_window, usage_report
from slurm_gpu_exporter.report.errors import ReportError
from slurm_gpu_exporter.report.figures.gpu_events import GpuFault, Throttle
from slurm_gpu_exporter.report.render.usage import render_usage
from tests.report.archive.archive_data import DEC_1, NOV_1, record


def _as_version(url: str, version: int) -> None:
    """Turn a current store back into what ``version`` made (its roll-up as it was)."""
    engine = create_engine(parse_db_url(url).render_as_string(hide_password=False))
    with engine.begin() as conn:
        # The usage index covers columns of every version (version 3 makes it afresh).
        conn.execute(text("DROP INDEX IF EXISTS archive_jobs_usage"))
        for later in range(SCHEMA_VERSION, version, -1):
            for table, column in added_in(later):
                conn.execute(text(f"ALTER TABLE {table.name} DROP COLUMN {column}"))
        conn.execute(text(f"UPDATE archive_meta SET value = '{version}' "
                          "WHERE key = 'schema_version'"))
    engine.dispose()


def test_a_version_1_archive_migrates_and_keeps_its_rows(archive_url: str) -> None:
    assert SCHEMA_VERSION >= 5  # later ones: job figures' columns (figures/table.py)
    old = record("41", gpus=2, hours=2.0, busy=0.5)
    with ArchiveStore(archive_url, write=True) as store:
        store.store([old], archived_at=NOV_1)
    _as_version(archive_url, 1)
    with pytest.raises(ReportError) as refused, ArchiveStore(archive_url, write=False):
        pass
    assert refused.value.exit_code == EXIT_STORE_UNREACHABLE
    assert "run `slurm-gpu-report archive` once" in str(refused.value)

    with ArchiveStore(archive_url, write=True) as store:  # what `archive` does first
        store.store([record("42", gpus=1, hours=1.0, busy=0.8)], archived_at=NOV_1)
    with ArchiveStore(archive_url, write=False) as store:
        found = store.details(["41", "42"])
    (was, _), = found["41"]
    assert was.usage.busy_s == old.detail.usage.busy_s
    assert was.usage.sm_active_s == old.detail.usage.sm_active_s
    assert was.usage.tensor_active_s is None and was.usage.dram_active_ratio is None
    assert was.nodes[0].gpus[0].tensor_active_s is None
    (new, _), = found["42"]
    assert new.usage.tensor_active_ratio == pytest.approx(0.2)
    assert new.usage.dram_active_ratio == pytest.approx(0.8 / 3)
    assert new.nodes[0].gpus[0].dram_active_s == pytest.approx(3600 * 0.8 / 3)


def _with_cpu_energy(jobid: str, cpu_j: float, factor: float):  # type: ignore[no-untyped-def]
    rec = record(jobid, gpus=1, hours=1.0, busy=0.8)
    rec.detail.nodes[0].cpu_energy_j = cpu_j
    rec.detail.gco2e_per_kwh = factor
    return rec


def test_a_version_2_archive_migrates_its_rollup_and_keeps_its_rows(archive_url: str
                                                                    ) -> None:
    old = record("51", gpus=2, hours=2.0, busy=0.5)
    with ArchiveStore(archive_url, write=True) as store:
        store.store([old], archived_at=NOV_1)
    _as_version(archive_url, 2)
    with pytest.raises(ReportError), ArchiveStore(archive_url, write=False):
        pass
    new = _with_cpu_energy("52", cpu_j=1.8e6, factor=400.0)
    with ArchiveStore(archive_url, write=True) as store:  # migrates, then stores
        store.store([new], archived_at=NOV_1)
        assert store.inconsistent() == []
    with ArchiveStore(archive_url, write=False) as store:
        found = store.details(["51", "52"])
        report = usage_report(store, month_window("2026-11", DEC_1 + 86400), ["user"])
    engine = create_engine(parse_db_url(archive_url).render_as_string(hide_password=False))
    with engine.connect() as conn:
        (index,) = [i for i in inspect(conn).get_indexes("archive_jobs")
                    if i["name"] == "archive_jobs_usage"]
    engine.dispose()
    assert {"tensor_active_s", "cpu_energy_j", "emissions_g"} <= set(index["column_names"])
    (was, _), = found["51"]
    assert was.usage.busy_s == old.detail.usage.busy_s
    assert was.cpu_energy_j is None and was.emissions_gco2e is None
    (now, _), = found["52"]
    gpu_kwh = 3600 * 300 / 3.6e6
    assert now.cpu_energy_j == pytest.approx(1.8e6)
    assert now.total_energy_kwh == pytest.approx(gpu_kwh + 0.5)
    assert now.emissions_gco2e == pytest.approx((gpu_kwh + 0.5) * 400.0)
    # the roll-up, rebuilt from the rows, sums what version 2 had no sum for
    (alice,) = report.groups
    assert alice.jobs == 2
    assert alice.tensor_active_s == pytest.approx(old.detail.usage.tensor_active_s
                                                  + new.detail.usage.tensor_active_s)
    assert alice.dram_active_s == pytest.approx(old.detail.usage.dram_active_s
                                                + new.detail.usage.dram_active_s)
    assert alice.cpu_energy_kwh == pytest.approx(0.5)
    assert alice.emissions_g == pytest.approx((gpu_kwh + 0.5) * 400.0)
    import json

    (row,) = json.loads(render_usage(report, "json"))["groups"]
    assert row["cpu_energy_kwh"] == pytest.approx(0.5)
    assert row["emissions_kg"] == pytest.approx((gpu_kwh + 0.5) * 0.4)
    assert row["tensor_active_gpu_hours"] == pytest.approx(alice.tensor_active_s / 3600)


def test_a_version_3_archive_migrates_and_new_rows_keep_their_array_task(archive_url: str
                                                                        ) -> None:
    """Version 4 keeps each job's array task: the reports show it as ``1234_5``; rows
    archived before show their bare id, and a later run without the labels keeps it."""
    old = record("61", gpus=1, hours=1.0, busy=0.5)
    with ArchiveStore(archive_url, write=True) as store:
        store.store([old], archived_at=NOV_1)
    _as_version(archive_url, 3)
    with pytest.raises(ReportError), ArchiveStore(archive_url, write=False):
        pass
    task = record("64", gpus=1, hours=1.0, busy=0.5)
    task.detail.usage = replace(task.detail.usage, array_job_id="60", array_task_id="3")
    hostile = record("65", gpus=1, hours=1.0, busy=0.5)
    hostile.detail.usage = replace(hostile.detail.usage, array_job_id="6" * 40,
                                   array_task_id="x")
    with ArchiveStore(archive_url, write=True) as store:  # migrates, then stores
        store.store([task, hostile], archived_at=NOV_1)
    again = record("64", gpus=1, hours=1.0, busy=0.5)  # a later run: labels gone
    with ArchiveStore(archive_url, write=True) as store:
        store.store([again], archived_at=NOV_1 + 60)
    with ArchiveStore(archive_url, write=False) as store:
        found = store.details(["61", "64", "65"])
    shown = {jobid: found[jobid][0][0].usage.shown for jobid in found}
    assert shown == {"61": "61", "64": "60_3", "65": "65"}


def test_a_version_4_archive_migrates_and_new_rows_keep_throttling_and_xids(archive_url: str
                                                                           ) -> None:
    """Version 5 keeps what slowed each GPU and what went wrong on it: old rows read as
    not counted (NULL, no lines), new rows give the job report its lines back, and a
    later run without the series keeps them."""
    old = record("71", gpus=1, hours=1.0, busy=0.5)
    with ArchiveStore(archive_url, write=True) as store:
        store.store([old], archived_at=NOV_1)
    _as_version(archive_url, 4)
    with pytest.raises(ReportError), ArchiveStore(archive_url, write=False):
        pass
    slowed = record("72", gpus=2, hours=1.0, busy=0.5)
    gpu = slowed.detail.nodes[0].gpus[1]
    gpu.throttled = [Throttle("power", 900.0), Throttle("thermal", 0.0)]
    gpu.faults = [GpuFault("xid", "79", 2, NOV_1 + 3600), GpuFault("pcie_replays", "", 5)]
    slowed.detail.nodes[0].gpus[0].throttled = [Throttle("power", 100.0)]
    with ArchiveStore(archive_url, write=True) as store:  # migrates, then stores
        store.store([slowed], archived_at=NOV_1)
    later = record("72", gpus=2, hours=1.0, busy=0.5)  # a later run: no such series
    with ArchiveStore(archive_url, write=True) as store:
        store.store([later], archived_at=NOV_1 + 60)
    engine = create_engine(parse_db_url(archive_url).render_as_string(hide_password=False))
    with engine.connect() as conn:
        rows = dict(conn.execute(text("SELECT jobid, xid_errors FROM archive_jobs")).all())
        throttled = conn.execute(text("SELECT throttled, gpu_errors FROM archive_jobs "
                                      "WHERE jobid = '72'")).one()
    engine.dispose()
    assert rows == {"71": None, "72": 2.0}
    assert json.loads(throttled[0]) == {"power": 1000.0, "thermal": 0.0}
    assert json.loads(throttled[1]) == {"xid:79": 2.0, "pcie_replays": 5.0}
    with ArchiveStore(archive_url, write=False) as store:
        found = store.details(["71", "72"])
    (was, _), = found["71"]
    assert all(not g.throttled and not g.faults for g in was.nodes[0].gpus)
    (now, _), = found["72"]
    back = now.nodes[0].gpus[1]
    assert back.throttled == [Throttle("power", 900.0), Throttle("thermal", 0.0)]
    assert back.faults == [GpuFault("xid", "79", 2.0, NOV_1 + 3600),
                           GpuFault("pcie_replays", "", 5.0)]
