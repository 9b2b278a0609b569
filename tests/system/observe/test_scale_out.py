"""Same answers whatever the topology (issue 35).

A simulated fleet of 16 GPU nodes (8 GPUs, 8 jobs each; a quarter of the nodes split into
MIG instances) is scraped by one Prometheus and by two shards that remote-write to a real
VictoriaMetrics. While the jobs run, ``enforce --format json`` (a dry run) decides on
them against both at once, Slurm's view coming from a stand-in ``squeue`` that lists
the fleet's jobs as running on their node. Every job ends 40 s after the fleet starts
and lingers, so its counters stop: once both stores hold the last values, the central
commands, run as subprocesses with ``--format json``, must give the same answers against
one Prometheus as against the store: the low-util report, ``job`` reports, and the rows
``archive`` writes.
"""

from __future__ import annotations

import importlib
import json
import os
import sqlite3
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support import wait_until
from tests.system.observe.topology import Topologies, topologies

pytestmark = pytest.mark.process

REPORT = Path(sys.executable).parent / "slurm-gpu-report"
NODES = 16
# Long enough for enforce's 20 s window to fill on both stores while the jobs run.
JOBS_END_AFTER = 40
ENFORCE_WINDOW = 20
ENFORCE_POLICY = f"""
[idle]
busy_fraction = 0.05
warn_after = []
cancel_after = "{ENFORCE_WINDOW}s"
min_job_age = "5s"
max_cancels_per_run = 1000
"""
ALLOCATED = "slurm_job_gpu_allocated_seconds_total"


@dataclass(frozen=True)
class EnforceRun:
    rc: int
    answer: dict
    stderr: str


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Topologies, Path]]:
    base = tmp_path_factory.mktemp("scale-out")
    args = ["--nodes", str(NODES), "--mig-share", "0.25", "--sample-interval", "1",
            "--linger", "100000", "--jobs-end-after", str(JOBS_END_AFTER)]
    with topologies(base, args) as tops:
        tops.one.wait_for("slurm_job_info", timeout=30, min_results=NODES * 8)
        yield tops, base


def _squeue_stand_in(tops: Topologies, where: Path) -> dict[str, str]:
    """A ``squeue`` first on PATH that lists every fleet job as RUNNING on its node with
    the GPUs its series show (what Slurm would say of these jobs); the env to use it."""
    info = tops.one.vector("slurm_job_info")
    # Each fleet node's Slurm name, as its agent publishes it.
    node_of = {s["metric"]["instance"]: s["metric"]["slurm_node"]
               for s in tops.one.vector("slurm_gpu_exporter_node_info")}
    gpus: dict[str, int] = {}
    for sample in tops.one.vector(ALLOCATED):
        gpus[sample["metric"]["jobid"]] = gpus.get(sample["metric"]["jobid"], 0) + 1
    starts = {s["metric"]["jobid"]: float(s["value"][1])
              for s in tops.one.vector("slurm_job_start_time_seconds")}
    jobs = [{"job_id": int(m["jobid"]), "user_name": m["user"], "account": m["account"],
             "partition": m["partition"], "qos": m.get("qos", ""), "name": m["name"],
             "job_state": ["RUNNING"], "start_time": {"set": True,
                                                      "number": int(starts[m["jobid"]])},
             "job_resources": {"nodes": {"allocation": [
                 {"name": node_of[m["instance"]]}]}},
             "tres_alloc_str": f"cpu=8,gres/gpu={gpus[m['jobid']]}"}
            for m in (s["metric"] for s in info)]
    bin_dir = where / "bin"
    bin_dir.mkdir()
    (where / "squeue.json").write_text(json.dumps({"jobs": jobs}))
    script = bin_dir / "squeue"
    script.write_text(f"#!/bin/sh\nexec cat {where / 'squeue.json'}\n")
    script.chmod(stat.S_IRWXU)
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}"}


def _enforce_both(tops: Topologies, base: Path, env: dict[str, str]) -> dict[str, EnforceRun]:
    """One dry run against each topology, started together so that both decide at
    (nearly) the same moment."""
    policy = base / "policy.toml"
    policy.write_text(ENFORCE_POLICY)
    procs = {}
    for name, url in (("one", tops.one.url), ("store", tops.store.url)):
        procs[name] = subprocess.Popen(
            [str(REPORT), "enforce", "--policy", str(policy), "--format", "json",
             "--prometheus-url", url, "--state-file", str(base / f"enforce-{name}.json")],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**_report_env(), **env})
    runs = {}
    for name, proc in procs.items():
        out, err = proc.communicate(timeout=120)
        assert proc.returncode in (0, 7), (name, out, err)  # 7: some jobs doubtful
        runs[name] = EnforceRun(proc.returncode, json.loads(out), err)
    return runs


def _uncovered(run: EnforceRun) -> set[str]:
    return {d["jobid"] for d in run.answer["decisions"] if "do not cover" in d["reason"]}


@pytest.fixture(scope="module")
def enforce_runs(fleet: tuple[Topologies, Path]) -> dict[str, EnforceRun]:
    """enforce against both while the jobs run, once both stores hold the whole window.
    MIG instances have no busy time, so their jobs never have full windows; a run in
    which other jobs lack them too (a late remote write) is taken again."""
    tops, base = fleet
    mig_jobs = {s["metric"]["jobid"] for s in tops.one.vector(ALLOCATED)
                if "." in s["metric"]["gpu"]}
    env = _squeue_stand_in(tops, base)
    gained = (f"min(max_over_time({ALLOCATED}[{ENFORCE_WINDOW}s])"
              f" - min_over_time({ALLOCATED}[{ENFORCE_WINDOW}s]))")

    def filled() -> bool:  # enforce needs 0.8 of the window covered; ask for more
        return all(answer and float(answer[0]["value"][1]) >= 0.85 * ENFORCE_WINDOW
                   for answer in (tops.one.vector(gained), tops.store.vector(gained)))

    wait_until(filled, JOBS_END_AFTER, "both stores to hold enforce's window", poll=0.5,
               log=tops.store.log)
    jobs_end = tops.fleet.spawned + JOBS_END_AFTER  # the earliest the jobs can end

    def covered() -> dict[str, EnforceRun] | None:
        runs = _enforce_both(tops, base, env)
        assert time.time() < jobs_end, "the jobs ended before enforce ran: raise JOBS_END_AFTER"
        return runs if all(_uncovered(r) == mig_jobs for r in runs.values()) else None

    return wait_until(covered, max(1.0, jobs_end - time.time()),
                      "enforce runs that see the whole window on both", poll=0.5)


@pytest.fixture(scope="module")
def tops_at(fleet: tuple[Topologies, Path], enforce_runs: dict[str, EnforceRun]
            ) -> tuple[Topologies, float]:
    """The topologies once every job ended and both stores hold the last samples (after
    enforce ran on the running jobs)."""
    tops, _ = fleet
    ended = tops.fleet.listening + JOBS_END_AFTER  # the latest the jobs can end
    # Both stores hold samples taken after every job ended (and the store has them all).
    wait_until(lambda: time.time() > ended + 4, JOBS_END_AFTER + 10, "the jobs to end")

    def caught_up() -> bool:
        want = len(tops.one.vector(ALLOCATED))
        got = tops.store.vector(f"count({ALLOCATED} and timestamp({ALLOCATED}) > {ended + 2})")
        return bool(got) and int(float(got[0]["value"][1])) == want

    wait_until(caught_up, 30, "VictoriaMetrics to hold the last samples", poll=0.5,
               log=tops.store.log)
    tops.ended = ended
    return tops, time.time()


def _report_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("SLURM_GPU_REPORT")}


def _report(url: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(REPORT), *args, "--prometheus-url", url], capture_output=True,
                          text=True, timeout=120, env=_report_env(), check=False)


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


def _every_target_scraped(tops: Topologies, earliest: float) -> float:
    """The first second from ``earliest`` at which both stores' last scrape of every
    target succeeded. A scrape past its 1 s timeout on a busy machine marks that store's
    series stale until the next one, so an instant query there (fresh, up) answers for
    one store only: that is the machine, not enforce's queries."""
    at = earliest
    while True:
        wait_until(lambda t=at: time.time() > t + 2, 30, "the windows to pass the jobs' end")
        ups = [store.vector("min(up)", at) for store in (tops.one, tops.store)]
        if all(up and float(up[0]["value"][1]) == 1 for up in ups):
            return at
        assert at < earliest + 30, f"no second in 30 s with every target scraped: {ups}"
        at += 1


def test_enforces_queries_answer_the_same(tops_at: tuple[Topologies, float]) -> None:
    """enforce's decisions need Slurm's running jobs (the fleet's are not Slurm's), so its
    queries are compared instead, at a time when both windows hold only ended jobs."""
    tops, _ = tops_at
    at = _every_target_scraped(tops, tops.ended + 14)
    for name, query in _idle_queries().items():
        one, store = _by_series(tops.one.vector(query, at)), _by_series(
            tops.store.vector(query, at))
        assert one.keys() == store.keys(), name
        assert one, name
        if name == "fresh":  # the sample's own time: each store scraped at its own phase
            assert all(abs(one[k] - store[k]) <= 1.5 for k in one), name
        else:
            assert _rounded(one) == _rounded(store), name


def test_enforce_decides_the_same_on_one_prometheus_and_on_the_store(
        enforce_runs: dict[str, EnforceRun]) -> None:
    """Dry runs at the same moment over running jobs: the same action, idle time and
    reason for every job (the idle quarter due for its cancel, MIG jobs skipped)."""
    one, store = (_rounded(enforce_runs[n].answer) for n in ("one", "store"))
    assert one == store
    assert enforce_runs["one"].rc == enforce_runs["store"].rc
    actions = [d["action"] for d in one["decisions"]]  # type: ignore[index]
    assert len(actions) == NODES * 8 and {"cancel", "none", "skip"} <= set(actions), actions
