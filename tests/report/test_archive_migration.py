"""An archive of schema version 1 (before tensor and DRAM activity) on SQLite and on a
real PostgreSQL: read-only commands ask for one `archive` run; a writer migrates it in
place, the old rows keep their figures (the new ones NULL: not measured) and new rows
store the activity."""

from __future__ import annotations

import pytest
from sqlalchemy import create_engine, text

from slurm_gpu_exporter.report.archive.schema import ADDED_IN_V2, SCHEMA_VERSION
from slurm_gpu_exporter.report.archive.store import (
    EXIT_STORE_UNREACHABLE,
    ArchiveStore,
    parse_db_url,
)
from slurm_gpu_exporter.report.errors import ReportError
from tests.report.archive_data import NOV_1, record


def _as_version_1(url: str) -> None:
    """Turn a current store back into what version 1 made."""
    engine = create_engine(parse_db_url(url).render_as_string(hide_password=False))
    with engine.begin() as conn:
        for table, column in ADDED_IN_V2:
            conn.execute(text(f"ALTER TABLE {table.name} DROP COLUMN {column}"))
        conn.execute(text("UPDATE archive_meta SET value = '1' WHERE key = 'schema_version'"))
    engine.dispose()


def test_a_version_1_archive_migrates_and_keeps_its_rows(archive_url: str) -> None:
    assert SCHEMA_VERSION == 2
    old = record("41", gpus=2, hours=2.0, busy=0.5)
    with ArchiveStore(archive_url, write=True) as store:
        store.store([old], archived_at=NOV_1)
    _as_version_1(archive_url)
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
