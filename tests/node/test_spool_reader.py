"""The agent's spool reader: an unchanged spool directory costs a stat, not a listing."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from slurm_gpu_exporter.hooks import spool
from slurm_gpu_exporter.node import spool_reader
from slurm_gpu_exporter.node.source_health import SourceErrors
from slurm_gpu_exporter.node.spool_reader import RELIST_S, SpoolReader

TRUSTED = frozenset({0, os.geteuid()})


def _write(dir_path: Path, jobid: str) -> None:
    fd = spool.open_spool_dir(str(dir_path), create=True)
    try:
        spool.write_record(fd, spool.JobRecord(jobid=jobid, uid=0))
    finally:
        os.close(fd)


def test_an_unchanged_spool_is_not_listed_again_a_changed_one_is(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(spool_reader, "SAME_TICK_S", 0.0)  # no waiting out the clock tick
    now = [0.0]
    reader = SpoolReader(str(tmp_path), SourceErrors(), TRUSTED, clock=lambda: now[0])
    _write(tmp_path, "1")
    assert set(reader.read()) == {"1"}
    assert reader.listings == 1
    for _ in range(3):
        now[0] += 5
        assert set(reader.read()) == {"1"}
    assert reader.listings == 1
    time.sleep(0.02)  # past the clock tick of the last change (at most 10 ms)
    _write(tmp_path, "2")  # the prolog's rename
    now[0] += 5
    assert set(reader.read()) == {"1", "2"}
    assert reader.listings == 2
    time.sleep(0.02)
    reader.remove(["1"])
    now[0] += 5
    assert set(reader.read()) == {"2"}
    assert reader.listings == 3
    now[0] += RELIST_S  # listed again after a while all the same
    assert set(reader.read()) == {"2"}
    assert reader.listings == 4


def test_a_spool_changed_within_the_clock_tick_is_listed_every_time(tmp_path: Path) -> None:
    reader = SpoolReader(str(tmp_path), SourceErrors(), TRUSTED)
    _write(tmp_path, "1")
    reader.read()
    reader.read()
    assert reader.listings == 2  # just changed: its mtime may not show the next change
