"""The job archive end to end: real Slurm with slurmdbd over MariaDB, the agent over the
fake NVML, a real Prometheus scraping it; jobs that complete, fail, get cancelled and
time out; ``archive`` into SQLite and into a real PostgreSQL; then a new, empty
Prometheus (the data past retention): ``job --db``, ``usage`` and ``low-util --db``
give what the live report gave, and states and exit codes are sacct's.

One module-scoped scenario; the asserts below share it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from slurm_gpu_exporter.report.archive.store import ArchiveStore
from slurm_gpu_exporter.report.slurm.accounting import parse_reqmem, parse_timelimit
from tests.fakenvml import Pattern, Process
from tests.report.pgserver import PostgresServer
from tests.support import wait_until
from tests.support.daemons import Prometheus
from tests.support.rig import Rig
from tests.support.slurmcluster import SlurmCluster

pytestmark = [pytest.mark.process, pytest.mark.slurm, pytest.mark.every_release,
              pytest.mark.fakenvml,
              pytest.mark.prometheus]

REPORT = str(Path(sys.executable).parent / "slurm-gpu-report")
# name -> (user, sbatch arguments, script, busy percent of its GPU; None: no process)
JOBS = {
    # Busy all the time, and long enough to stay over low-util's 0.6 whatever its start
    # and its last, late process samples cost (see below); the timeout job's minute
    # covers its length.
    "completed": ("sgeuser", [], "sleep 20\nexit 0\n", 100),
    "failed": ("sgeuser2", [], "sleep 10\nexit 3\n", 30),
    "cancelled": ("sgeuser", ["--account=chemistry"], "sleep 300\n", None),
    # Slurm's time limits are whole minutes, checked every 30 s: this one ends at 60-90 s.
    "timeout": ("sgeuser2", ["--time=1"], "sleep 300\n", 50),
}
CANCEL_AFTER_S = 8


@dataclass
class Scenario:
    jobids: dict[str, str]
    sacct: dict[str, dict[str, str]]
    live: dict[str, dict]  # type: ignore[type-arg]  # `job --format json` from the live store
    dbs: dict[str, str]  # backend -> archive URL
    archive_runs: list[subprocess.CompletedProcess[str]]
    rows_after_each_run: dict[str, list[tuple[int, int]]]
    empty_prometheus: str
    # Before the first submission: the cluster's spool may hold jobs of earlier sessions,
    # which the agent shows (ended) and the archive stores; they ended before this.
    submitted_at: float
    # When the jobs' processes were given their busy patterns: a job's GPU is idle
    # before (finding its process takes a moment, longer on a loaded machine).
    busy_from: float


def report(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([REPORT, *args], capture_output=True, text=True, timeout=120,
                          check=False, env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8",
                                            **_slurm_env})


_slurm_env: dict[str, str] = {}


def _sleep_pid(cluster: SlurmCluster, jobid: int) -> int | None:
    for pid in cluster.job_pids(jobid, "batch"):
        try:
            if Path(f"/proc/{pid}/comm").read_text().strip() == "sleep":
                return pid
        except OSError:
            continue
    return None


def _gpu_of(cluster: SlurmCluster, jobid: int) -> int | None:
    path = cluster.spool_dir / f"{jobid}.json"
    try:
        return int(json.loads(path.read_text())["job_gpus"])
    except (OSError, ValueError, KeyError):
        return None


@pytest.fixture(scope="module")
def scenario(slurm_cluster: SlurmCluster, tmp_path_factory: pytest.TempPathFactory
             ) -> Iterator[Scenario]:
    work = tmp_path_factory.mktemp("archive-slurm")
    _slurm_env.update(slurm_cluster.env)
    ids: dict[str, int] = {}
    rig = empty = pg = None
    try:
        # A job an earlier test cancelled may still be ending: it would end in the window.
        slurm_cluster.wait_no_jobs()
        # The job that times out first, before the daemons start: its minute (and up to
        # 30 s more, until slurmctld's next check) covers everything else. Only the
        # completed job's busy time is held to a truth counted from its start.
        submitted_at = time.time()
        user, extra, script, _ = JOBS["timeout"]
        ids["timeout"] = slurm_cluster.submit(script, user=user, gres="gpu:1", extra_args=extra)
        pg = PostgresServer()
        rig = Rig(work, cluster=slurm_cluster,
                  command=slurm_cluster.site_command("slurm-gpu-exporter"))
        prom = rig.prom
        # The others start once the agent samples: it counts a GPU's time from its first
        # sample, while the truth below counts from the job's start (a loaded machine
        # took over a second to start the agent, and the idle part of a job's first
        # seconds went uncounted).
        for name in ("completed", "failed", "cancelled"):
            user, extra, script, _ = JOBS[name]
            ids[name] = slurm_cluster.submit(script, user=user, gres="gpu:1", extra_args=extra)
        started = time.monotonic()
        for jobid in ids.values():
            slurm_cluster.wait_state(jobid, "RUNNING", timeout=30)
        pids = {name: wait_until(lambda j=jobid: _sleep_pid(slurm_cluster, j), 15,
                                 f"the sleep of job {name}") for name, jobid in ids.items()}
        gpus = {name: wait_until(lambda j=jobid: _gpu_of(slurm_cluster, j) is not None
                                 and (_gpu_of(slurm_cluster, j),), 15, f"the GPU of {name}")[0]
                for name, jobid in ids.items()}
        for name, pid in pids.items():
            busy = JOBS[name][3]
            if busy is not None:
                rig.devices[gpus[name]].processes = [Process(pid, 2 << 30,
                                                             sm=Pattern.constant(busy))]
        rig.write_nvml()
        busy_from = time.time()
        time.sleep(max(0.0, started + CANCEL_AFTER_S - time.monotonic()))  # cancel time
        slurm_cluster.cancel(ids["cancelled"])
        for jobid in ids.values():
            slurm_cluster.wait_finished(jobid, timeout=120)
        jobids = {name: str(jobid) for name, jobid in ids.items()}
        sacct = slurm_cluster.wait_accounted(ids.values())
        # Every job's end scraped: the last counters are in Prometheus.
        ended = f'slurm_job_end_time_seconds{{jobid=~"{"|".join(jobids.values())}"}}'
        prom.wait_for(f"count(last_over_time({ended}[10m])) == 4", timeout=30)
        live = report("job", *jobids.values(), "--format", "json", "--prometheus-url",
                      prom.url)
        assert live.returncode == 0, live.stderr
        by_id = {j["job"]: j for j in json.loads(live.stdout)["jobs"]}
        dbs = {"sqlite": f"sqlite:///{work / 'archive.sqlite'}",
               "postgresql": pg.create_database("archive")}
        runs, rows = [], {}
        for backend, url in dbs.items():
            rows[backend] = []
            for since in ("10m", "20m"):  # overlapping windows
                got = report("archive", "--since", since, "--db", url, "--prometheus-url",
                             prom.url)
                runs.append(got)
                with ArchiveStore(url, write=False) as store:
                    rows[backend].append(store.counts())
        prom.stop()
        empty = Prometheus("prometheus-empty", {"global": {"scrape_interval": "1s"}},
                           work / "prom-empty")
        empty.wait_ready()
        yield Scenario(jobids=jobids, sacct=sacct, live=by_id, dbs=dbs, archive_runs=runs,
                       rows_after_each_run=rows, empty_prometheus=empty.url,
                       submitted_at=submitted_at, busy_from=busy_from)
    finally:
        for thing in (empty, rig):
            if thing is not None:
                thing.stop()
        if pg is not None:
            pg.stop()
        for jobid in ids.values():
            slurm_cluster.cancel(jobid)


def test_sacct_has_the_real_states_exit_codes_and_accounts(scenario: Scenario) -> None:
    rows = {name: scenario.sacct[jobid] for name, jobid in scenario.jobids.items()}
    assert {n: r["State"].split()[0] for n, r in rows.items()} == {
        "completed": "COMPLETED", "failed": "FAILED", "cancelled": "CANCELLED",
        "timeout": "TIMEOUT"}
    assert rows["completed"]["ExitCode"] == "0:0" and rows["failed"]["ExitCode"] == "3:0"
    assert {n: r["Account"] for n, r in rows.items()} == {
        "completed": "physics", "failed": "chemistry", "cancelled": "chemistry",
        "timeout": "chemistry"}
    assert rows["timeout"]["Timelimit"] == "00:01:00"


def test_archive_stores_every_ended_job_once_over_overlapping_runs(scenario: Scenario) -> None:
    for run in scenario.archive_runs:
        assert run.returncode == 0, run.stderr
        assert "18 PromQL queries" in run.stdout, run.stdout
    for backend, counts in scenario.rows_after_each_run.items():
        first, again = counts
        assert first == again and first[0] >= 4, backend
        with ArchiveStore(scenario.dbs[backend], write=False) as store:
            ours = store.details(list(scenario.jobids.values()))
        assert sorted(ours) == sorted(scenario.jobids.values())
        assert all(len(found) == 1 and len(found[0][0].nodes[0].gpus) == 1
                   for found in ours.values())


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_job_from_the_archive_matches_the_live_report_and_sacct(
        scenario: Scenario, backend: str) -> None:
    got = report("job", *scenario.jobids.values(), "--format", "json", "--db",
                 scenario.dbs[backend], "--prometheus-url", scenario.empty_prometheus)
    assert got.returncode == 0, got.stderr
    archived = {j["job"]: j for j in json.loads(got.stdout)["jobs"]}
    assert set(archived) == set(scenario.live)
    for jobid, live in scenario.live.items():
        job = archived[jobid]
        assert set(job) == set(live)  # today's JSON shape
        assert job["busy_ratio"] == pytest.approx(live["busy_ratio"], abs=0.001)
        assert job["gpu_hours"] == pytest.approx(live["gpu_hours"], abs=1e-6)
        assert job["state"] == scenario.sacct[jobid]["State"].split()[0] == live["state"]
        assert job["notes"][0].startswith("From the job archive")
        assert job["notes"][1:] == live["notes"]
        # sacct's time limit and memory request, through the report's own parser.
        acct = scenario.sacct[jobid]
        assert job["time_limit_s"] == live["time_limit_s"] == parse_timelimit(acct["Timelimit"])
        requested = parse_reqmem(acct["ReqMem"], int(acct["AllocCPUS"]), 1)
        assert requested and job["memory_request_gib"] == pytest.approx(requested / 2**30)
    busy = {n: archived[j]["busy_ratio"] for n, j in scenario.jobids.items()}
    completed = archived[scenario.jobids["completed"]]
    run_time = completed["end"] - completed["start"]
    truth = (completed["end"] - scenario.busy_from) / run_time
    # The fake hands out a process's samples up to 4.5 s late, as drivers do: those of
    # the job's last seconds come after it ended, and are no longer its.
    assert truth - 4.5 / run_time - 0.05 <= busy["completed"] <= truth + 0.05
    assert busy["cancelled"] == 0
    with ArchiveStore(scenario.dbs[backend], write=False) as store:
        stored = store.details(list(scenario.jobids.values()))
    for jobid, ((detail, _),) in stored.items():
        assert detail.accounting is not None
        assert detail.accounting.exit_code == scenario.sacct[jobid]["ExitCode"]
        assert detail.accounting.requested_gpus == 1


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_usage_from_the_archive_gives_the_live_gpu_hours_per_account(
        scenario: Scenario, backend: str) -> None:
    got = report("usage", "--by", "account", "user", "--start",
                 f"{scenario.submitted_at:.3f}", "--format", "json", "--db", scenario.dbs[backend])
    assert got.returncode == 0, got.stderr
    groups = {(g["account"], g["user"]): g for g in json.loads(got.stdout)["groups"]}
    expected: dict[tuple[str, str], list[float]] = {}
    for live in scenario.live.values():
        sums = expected.setdefault((live["account"], live["user"]), [0.0, 0.0, 0])
        sums[0] += live["gpu_hours"]
        sums[1] += live["gpu_hours"] * live["busy_ratio"]
        sums[2] += 1
    assert set(groups) == set(expected) == {("physics", "sgeuser"), ("chemistry", "sgeuser"),
                                            ("chemistry", "sgeuser2")}
    for key, (held, busy, jobs) in expected.items():
        assert groups[key]["jobs"] == jobs
        assert groups[key]["gpu_hours"] == pytest.approx(held, abs=1e-6)
        assert groups[key]["busy_ratio"] == pytest.approx(busy / held, abs=0.001)


def test_low_util_past_retention_comes_from_the_archive_and_says_so(scenario: Scenario) -> None:
    got = report("low-util", "--start", f"{scenario.submitted_at:.3f}", "--threshold", "0.6",
                 "--format", "json",
                 "--db", scenario.dbs["sqlite"], "--prometheus-url", scenario.empty_prometheus)
    assert got.returncode == 0, got.stderr
    flagged = {j["job"] for j in json.loads(got.stdout)["flagged"]}
    ids = scenario.jobids
    assert flagged == {ids["failed"], ids["cancelled"], ids["timeout"]}
    assert "0 jobs from Prometheus, 4 ended ones only in the archive" in got.stderr
