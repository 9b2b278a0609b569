"""``slurm-gpu-report enforce`` on job arrays, on real parts: Slurm, the agent over
the fake NVML, a real Prometheus scraping it every second.

Slurm keeps the array's own job id on the last task it starts, and ``scancel <array
id>`` acts on every task of the array: enforce must name an array task as ``A_T``. The
policy cancels after 10 s idle, with no warnings (nothing to notify). A GPU a job holds
with no process on it is idle; one with a process at 80 % SM is busy.

Het jobs are covered by the fast tests (tests/report/enforce/test_enforce_arrays.py) only: on
the one-node test cluster a het job stays PENDING (Reason=Resources) past the backfill
pass, with two GPU components as with one GPU and one CPU-only component: its
components want nodes of their own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.fakenvml import Pattern, Process
from tests.support import wait_until
from tests.support.rig import Rig, Scrape
from tests.support.slurmcluster import SlurmCluster

pytestmark = [pytest.mark.process, pytest.mark.slurm, pytest.mark.every_release,
              pytest.mark.fakenvml,
              pytest.mark.prometheus]

REPORT = Path(sys.executable).parent / "slurm-gpu-report"
POLICY = """
[idle]
busy_fraction = 0.01
warn_after = []
cancel_after = "10s"
min_job_age = "5s"
max_cancels_per_run = 10
"""
BUSY = Pattern.constant(80)


@dataclass
class Arrays:
    cluster: SlurmCluster
    rig: Rig
    base: Path

    def enforce(self, *extra: str) -> dict[str, Any]:
        """One enforce run (JSON); its decisions by job id, its exit code and stderr."""
        argv = [str(REPORT), "enforce", "--policy", str(self.base / "policy.toml"),
                "--format", "json", "--prometheus-url", self.rig.prom.url, "--timeout", "5",
                "--node-label", "node", "--state-file", str(self.base / "enforce.json"),
                *extra]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False,
                              env={**os.environ, **self.cluster.env})
        decisions = ({d["jobid"]: d for d in json.loads(proc.stdout)["decisions"]}
                     if proc.stdout.startswith("{") else {})
        return {"decisions": decisions, "rc": proc.returncode, "stderr": proc.stderr}

    def gpu_of(self, jobid: int) -> int:
        gpus = wait_until(lambda: self.cluster.spool_gpus(jobid), 15,
                          f"the prolog's spool record of job {jobid}")
        assert len(gpus) == 1
        return gpus[0]

    def load(self, busy: dict[int, int], idle: list[int]) -> None:
        """Each job's GPU: busy (a process of the job at 80 % SM) or idle (none)."""
        for jobid, pid in busy.items():
            self.rig.devices[self.gpu_of(jobid)].processes = [Process(pid, 1 << 30, sm=BUSY)]
        for jobid in idle:
            self.rig.devices[self.gpu_of(jobid)].processes = []
        self.rig.write_nvml()


@pytest.fixture(scope="module")
def arrays(slurm_cluster: SlurmCluster, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[Arrays]:
    base = tmp_path_factory.mktemp("enforce-arrays")
    (base / "policy.toml").write_text(POLICY)
    with Rig(base, cluster=slurm_cluster,
             command=slurm_cluster.site_command("slurm-gpu-exporter"),
             scrape=Scrape("slurm-gpu-exporter", {"node": slurm_cluster.node_name},
                           timeout="1s")) as rig:
        slurm_cluster.wait_no_jobs()
        yield Arrays(slurm_cluster, rig, base)


def _array_of_two(arrays: Arrays) -> tuple[int, dict[int, int], dict[int, int]]:
    """An array of two one-GPU tasks, both running: (array id, task -> job id,
    job id -> batch pid)."""
    array = arrays.cluster.submit("sleep 300\n", gres="gpu:1", extra_args=["--array=0-1"])
    tasks = wait_until(lambda: len(t := arrays.cluster.array_task_job_ids(array)) == 2 and t,
                       30, f"both tasks of array {array} split off")
    pids = {}
    for jobid in tasks.values():
        arrays.cluster.wait_state(jobid, "RUNNING", timeout=30)
        pids[jobid] = min(arrays.cluster.wait_for_process(jobid, "batch"))
    return array, tasks, pids


def _cancel_due(arrays: Arrays, jobid: int, what: str) -> dict[str, Any]:
    """Runs of enforce --cancel until one cancels ``jobid``; that run."""
    runs: list[dict[str, Any]] = []

    def probe() -> dict[str, Any] | None:
        run = arrays.enforce("--cancel")
        runs.append(run)
        decision = run["decisions"].get(str(jobid), {})
        return run if decision.get("action") == "cancel" else None

    return wait_until(probe, 60, what, poll=0.5,
                      log=lambda: json.dumps(runs[-1:], indent=1)[-3000:])


@pytest.mark.parametrize("idle_task", ["holder", "sibling"])
def test_enforce_cancels_the_idle_array_task_alone(arrays: Arrays, idle_task: str) -> None:
    """The task that holds the array's id idle and its sibling busy (the issue's case:
    ``scancel <array id>`` took both), and the other way round: the idle task alone ends,
    the busy one still runs."""
    array, tasks, pids = _array_of_two(arrays)
    try:
        holder = array  # the task that started last kept the array's id
        assert holder in tasks.values(), tasks
        sibling = next(j for j in tasks.values() if j != holder)
        idle, busy = (holder, sibling) if idle_task == "holder" else (sibling, holder)
        arrays.load(busy={busy: pids[busy]}, idle=[idle])
        run = _cancel_due(arrays, idle, f"a run that cancels the idle task {idle}")
        arrays.cluster.wait_finished(idle, timeout=30)
        time.sleep(2)  # a cancel of the whole array would reach the busy task by now
        assert arrays.cluster.state(idle) == "CANCELLED"
        assert arrays.cluster.state(busy) == "RUNNING"
        running = arrays.cluster.run(["squeue", "-h", "-t", "R", "-o", "%A %i"]).split("\n")
        task_of = {j: t for t, j in tasks.items()}
        assert f"{busy} {array}_{task_of[busy]}" in running
        decision = run["decisions"][str(idle)]
        assert decision.get("target") == f"{array}_{task_of[idle]}"
        assert decision.get("job") == f"{array}_{task_of[idle]}"
        # Busy: nothing to do; on a loaded machine its fresh load can still be doubtful
        # (skipped), never for want of knowing which task it is.
        kept = run["decisions"][str(busy)]
        assert kept["action"] == "none" or (
            kept["action"] == "skip" and "array task" not in kept.get("reason", "")), kept
        # The reports show each task as users know it, from the agent's labels.
        report = subprocess.run(
            [str(REPORT), "job", str(busy), str(idle), "--no-sacct", "--format", "json",
             "--prometheus-url", arrays.rig.prom.url, "--since", "10m"],
            capture_output=True, text=True, timeout=60, check=False,
            env={**os.environ, **arrays.cluster.env})
        assert report.returncode == 0, report.stderr
        shown = [job["job"] for job in json.loads(report.stdout)["jobs"]]
        assert sorted(shown) == sorted(f"{array}_{t}" for t in tasks)
        # ... and take an array task by that name: the busy task, not the array's id.
        by_name = subprocess.run(
            [str(REPORT), "job", f"{array}_{task_of[busy]}", "--no-sacct", "--format",
             "json", "--prometheus-url", arrays.rig.prom.url, "--since", "10m"],
            capture_output=True, text=True, timeout=60, check=False,
            env={**os.environ, **arrays.cluster.env})
        assert by_name.returncode == 0, by_name.stderr
        (job,) = json.loads(by_name.stdout)["jobs"]
        assert job["job"] == f"{array}_{task_of[busy]}"
        assert job["busy_ratio"] > 0.05, job  # the busy task's figures: the idle one reads 0
    finally:
        arrays.cluster.cancel(array)
        arrays.cluster.wait_no_jobs()
