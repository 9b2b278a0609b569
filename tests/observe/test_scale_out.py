"""Same answers whatever the topology (issue 35).

A simulated fleet of 16 GPU nodes (8 GPUs, 8 jobs each; a quarter of the nodes split into
MIG instances) is scraped by one Prometheus and by two shards that remote-write to a real
VictoriaMetrics. Every job ends 20 s after the fleet starts and lingers, so its counters
stop: once both stores hold the last values, the central commands, run as subprocesses
with ``--format json``, must give the same answers against one Prometheus as against the
store: the low-util report, ``job`` reports, and the rows ``archive`` writes.
"""

from __future__ import annotations

import importlib
import json
import os
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.observe.topology import Topologies, topologies
from tests.support import wait_until

pytestmark = pytest.mark.process

REPORT = Path(sys.executable).parent / "slurm-gpu-report"
NODES = 16
JOBS_END_AFTER = 20


@pytest.fixture(scope="module")
def tops_at(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Topologies, float]]:
    base = tmp_path_factory.mktemp("scale-out")
    fleet = ["--nodes", str(NODES), "--mig-share", "0.25", "--sample-interval", "1",
             "--linger", "100000", "--jobs-end-after", str(JOBS_END_AFTER)]
    with topologies(base, fleet) as tops:
        started = time.time()
        jobs = NODES * 8
        tops.one.wait_for("slurm_job_info", timeout=30, min_results=jobs)
        ended = started + JOBS_END_AFTER
        # Both stores hold samples taken after every job ended (and the store has them all).
        wait_until(lambda: time.time() > ended + 4, JOBS_END_AFTER + 10, "the jobs to end")

        def caught_up() -> bool:
            allocated = "slurm_job_gpu_allocated_seconds_total"
            want = len(tops.one.vector(allocated))
            got = tops.store.vector(f"count({allocated} and timestamp({allocated}) > {ended + 2})")
            return bool(got) and int(float(got[0]["value"][1])) == want

        wait_until(caught_up, 30, "VictoriaMetrics to hold the last samples", poll=0.5,
                   log=tops.store.log)
        tops.ended = ended
        yield tops, time.time()


def _report(url: str, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_GPU_REPORT")}
    return subprocess.run([str(REPORT), *args, "--prometheus-url", url], capture_output=True,
                          text=True, timeout=120, env=env, check=False)


def _json(url: str, *args: str) -> object:
    run = _report(url, *args, "--format", "json")
    assert run.returncode == 0, run.stdout + run.stderr
    return _rounded(json.loads(run.stdout))


def _rounded(value: object) -> object:
    """Floats to 6 significant digits: the stores' arithmetic may differ in the last bits."""
    if isinstance(value, float):
        return float(f"{value:.6g}")
    if isinstance(value, list):
        return [_rounded(v) for v in value]
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items() if k not in {"generated", "now"}}
    return value


def test_the_shards_split_the_fleet_and_the_store_holds_all_of_it(
        tops_at: tuple[Topologies, float]) -> None:
    tops, _ = tops_at
    per_shard = [{s["metric"]["instance"] for s in shard.vector('up == 1')}
                 for shard in tops.shards]
    assert per_shard[0] & per_shard[1] == set()
    assert len(per_shard[0] | per_shard[1]) == NODES
    series = "count({__name__=~'slurm_job_.+'})"
    one = tops.one.vector(series)[0]["value"][1]
    assert tops.store.vector(series)[0]["value"][1] == one


def test_low_util_report_is_the_same_on_one_prometheus_and_on_the_store(
        tops_at: tuple[Topologies, float]) -> None:
    tops, at = tops_at
    window = ("--since", "10m", "--end", f"{at:.0f}")
    one = _json(tops.one.url, "low-util", *window)
    store = _json(tops.store.url, "low-util", *window)
    assert one == store
    assert one["jobs_seen"] == NODES * 8 and one["flagged"], one  # the idle quarter


def test_job_reports_are_the_same(tops_at: tuple[Topologies, float]) -> None:
    tops, at = tops_at
    ids = sorted(s["metric"]["jobid"] for s in tops.one.vector("slurm_job_info"))[::9]
    window = ("--since", "10m", "--end", f"{at:.0f}", "--no-sacct")
    assert _json(tops.one.url, "job", *ids, *window) == _json(tops.store.url, "job", *ids,
                                                              *window)


def _rows(db: Path) -> dict[str, list]:
    """Every archived job and GPU row (less when it was archived), and the roll-up."""
    out = {}
    with sqlite3.connect(db) as conn:
        tables = [r[0] for r in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name LIKE 'archive_%'"
            " AND name != 'archive_meta'")]
        for table in tables:
            cursor = conn.execute(f"SELECT * FROM {table}")  # names from sqlite_master
            names = [c[0] for c in cursor.description]
            out[table] = sorted((_rounded({k: v for k, v in zip(names, row, strict=True)
                                           if k != "archived_at"}) for row in cursor),
                                key=lambda r: json.dumps(r, sort_keys=True))
    return out


def test_archive_writes_the_same_rows(tops_at: tuple[Topologies, float], tmp_path: Path) -> None:
    tops, at = tops_at
    dbs = {}
    for name, url in (("one", tops.one.url), ("store", tops.store.url)):
        dbs[name] = tmp_path / f"{name}.sqlite"
        run = _report(url, "archive", "--since", "10m", "--end", f"{at:.0f}", "--no-sacct",
                      "--db", f"sqlite:///{dbs[name]}")
        assert run.returncode == 0, run.stdout + run.stderr
    one, store = _rows(dbs["one"]), _rows(dbs["store"])
    assert one == store
    assert len(one["archive_jobs"]) == NODES * 8


def _idle_queries() -> dict[str, str]:
    """enforce's instant queries (its idle windows, freshness, up, NVML), 5 s and 10 s
    windows, wherever the report's restructuring puts them."""
    for idle, queries in (("slurm_gpu_exporter.report.enforce.idle_window",
                           "slurm_gpu_exporter.report.prometheus.queries"),
                          ("slurm_gpu_exporter.report.idle_window",
                           "slurm_gpu_exporter.report.queries")):
        try:
            idle_window, filters = importlib.import_module(idle), importlib.import_module(queries)
        except ImportError:
            continue
        return idle_window.idle_queries((5.0, 10.0), filters.Filters())
    raise AssertionError("enforce's idle_queries moved: update this test")


def _by_series(samples: list[dict]) -> dict[str, float]:
    """value by series, less the shard label the store's series carry."""
    return {json.dumps({k: v for k, v in s["metric"].items() if k != "prometheus_shard"},
                       sort_keys=True): float(s["value"][1]) for s in samples}


def test_enforces_queries_answer_the_same(tops_at: tuple[Topologies, float]) -> None:
    """enforce's decisions need Slurm's running jobs (the fleet's are not Slurm's), so its
    queries are compared instead, at a time when both windows hold only ended jobs."""
    tops, _ = tops_at
    at = tops.ended + 14
    wait_until(lambda: time.time() > at + 2, 30, "the windows to pass the jobs' end")
    for name, query in _idle_queries().items():
        one, store = _by_series(tops.one.vector(query, at)), _by_series(
            tops.store.vector(query, at))
        assert one.keys() == store.keys(), name
        assert one, name
        if name == "fresh":  # the sample's own time: each store scraped at its own phase
            assert all(abs(one[k] - store[k]) <= 1.5 for k in one), name
        else:
            assert _rounded(one) == _rounded(store), name
