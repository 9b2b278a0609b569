"""SIGKILL of an archive writer at random points leaves a consistent store, and the next
run completes it.

The writer is the store path ``archive`` takes after its queries (``ArchiveStore.store``,
batch by batch, over records built in code): the transaction logic under test is all
there, so no Prometheus runs. The writer is forked from the test (no interpreter start
per kill), on SQLite and on a real PostgreSQL.
"""

from __future__ import annotations

import multiprocessing
import os
import random
import signal
import time

import pytest

from slurm_gpu_exporter.report.archive.schema import gpus as gpus_table
from slurm_gpu_exporter.report.archive.schema import jobs as jobs_table
from slurm_gpu_exporter.report.archive.schema import usage_monthly
from slurm_gpu_exporter.report.archive.store import ArchiveStore
from slurm_gpu_exporter.report.figures.window import Window
from tests.report.archive.archive_data import NOV_1, record

pytestmark = pytest.mark.process

JOBS = 600
BATCH = 50
GPUS = 4
KILLS = 20


def _write_all(url: str, progress: int | None = None) -> None:
    records = [record(str(i), gpus=GPUS, end=NOV_1 + i) for i in range(JOBS)]
    with ArchiveStore(url, write=True) as store:
        for i in range(0, JOBS, BATCH):
            store.store(records[i:i + BATCH], archived_at=NOV_1 + 86400)
            if progress is not None:
                os.write(progress, b".")  # one batch committed


def _run(url: str, kill_at: tuple[int, float] | None = None) -> int | None:
    """Write every job in a child; with ``kill_at`` (batches, seconds), SIGKILL it that
    many seconds after that many batches were committed: a random point inside a run,
    whatever the machine's load makes a run last."""
    read_end, write_end = os.pipe()
    process = multiprocessing.get_context("fork").Process(target=_write_all,
                                                          args=(url, write_end))
    process.start()
    os.close(write_end)
    if kill_at is not None:
        batches, delay = kill_at
        for _ in range(batches):
            if not os.read(read_end, 1):
                break  # the writer ended first
        process.join(delay)
        if process.is_alive():
            os.kill(process.pid, signal.SIGKILL)
    process.join(60)
    os.close(read_end)
    return process.exitcode


def _empty(url: str) -> None:
    with ArchiveStore(url, write=True) as store, store.engine.begin() as conn:
        conn.execute(gpus_table.delete())
        conn.execute(jobs_table.delete())
        conn.execute(usage_monthly.delete())


def test_sigkill_at_random_points_leaves_a_consistent_store_the_next_run_completes(
        archive_url: str) -> None:
    # How long one batch takes here: each kill falls inside a batch chosen at random.
    started = time.monotonic()
    assert _run(archive_url) == 0
    per_batch = (time.monotonic() - started) / (JOBS // BATCH)
    rng = random.Random(21)
    killed = partial = 0
    for _ in range(KILLS):
        _empty(archive_url)  # each kill on its own; the last one's store is completed below
        kill_at = (rng.randrange(JOBS // BATCH), rng.uniform(0, per_batch))
        exitcode = _run(archive_url, kill_at)
        with ArchiveStore(archive_url, write=False) as store:
            jobs, gpus = store.counts()
            assert store.inconsistent() == []
        # Whole batches or nothing of one: every job with all its GPUs.
        assert jobs % BATCH == 0 and gpus == jobs * GPUS, (jobs, gpus)
        killed += exitcode == -signal.SIGKILL
        partial += 0 < jobs < JOBS
    assert killed >= KILLS // 4, f"only {killed} of {KILLS} kills fell inside a run"
    assert partial > 0
    assert _run(archive_url) == 0
    with ArchiveStore(archive_url, write=False) as store:
        assert store.counts() == (JOBS, JOBS * GPUS)
        assert store.inconsistent() == []  # the monthly roll-up too
        (november,) = store.usage(Window(NOV_1, NOV_1 + 30 * 86400), ["account"])
    assert november.jobs == JOBS
