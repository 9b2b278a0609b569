"""pyslurm and the Slurm CLI fill the same fields for the same jobs, on the release
pyslurm matches (PyPI's pyslurm 25.11 on Slurm 25.11, built in the release's root).

Both look-ups run as on a site's node: in the release's root, with the Python of the
pyslurm venv (tests/support/lookup_both.py). The truth they are held to is the test's
own: what it submitted, scontrol's records as the test parses them, and the GPU indices
the prolog recorded. Het jobs are left out: on this one-node cluster their components
pend on Resources (two components on one node under cons_tres), so none ever runs here.
"""

from __future__ import annotations

import json

import pytest

from tests.support import REPO, wait_until
from tests.support.slurmcluster import SlurmCluster

pytestmark = [pytest.mark.process, pytest.mark.slurm, pytest.mark.every_release("25.11")]

HOLD = "#!/bin/sh\nexec sleep 120\n"
# What both paths must agree on (cluster: scontrol never prints it, pyslurm does).
FIELDS = ("jobid", "uid", "user", "account", "partition", "qos", "name", "state",
          "array_job_id", "array_task_id", "job_gpus", "start_time")


def compare(cluster: SlurmCluster, jobs: list[int], tasks: dict[int, int],
            array: int | None) -> None:
    """Both look-ups of ``jobs`` (running) against the test's truth and each other."""
    for jobid in jobs:
        cluster.wait_state(jobid, "RUNNING", timeout=30)
        wait_until(lambda j=jobid: cluster.gpu_record(j), 15, f"job {jobid}'s spool record")
    python = cluster.run_as_site(["sh", "-c", "echo /opt/pyslurm-*/bin/python"]).strip()
    out = json.loads(cluster.run_as_site(
        [python, str(REPO / "tests/support/lookup_both.py"), str(REPO), cluster.node_name,
         *map(str, jobs)]))
    assert out["pyslurm_version"].startswith("25.11.")
    assert out["auto"] == "PySlurm"  # --slurm-lookup auto takes it on its release
    task_of = {j: t for t, j in tasks.items()}
    for jobid in jobs:
        record = next(r for r in cluster.job_info(jobid) if r["JobId"] == str(jobid))
        spool_gpus = ",".join(map(str, cluster.spool_gpus(jobid) or []))
        answers = out["jobs"][str(jobid)]
        for path in ("cli", "pyslurm"):
            got = answers[path]
            assert got is not None, f"{path} did not find job {jobid}"
            assert got["jobid"] == str(jobid)
            assert got["user"] == record["UserId"].split("(")[0]
            assert got["uid"] == int(record["UserId"].split("(")[1].rstrip(")"))
            assert got["account"] == record["Account"]
            assert got["state"] == "RUNNING"
            assert got["job_gpus"] == spool_gpus, (path, jobid, got)
            assert got["array_job_id"] == (str(array) if jobid in task_of else ""), got
            assert got["array_task_id"] == str(task_of.get(jobid, "")), got
            assert got["start_time"] is not None
        differ = {f: (answers["cli"][f], answers["pyslurm"][f]) for f in FIELDS
                  if answers["cli"][f] != answers["pyslurm"][f]}
        assert not differ, f"job {jobid}: cli vs pyslurm {differ}"


def test_pyslurm_and_the_cli_fill_the_same_fields_for_plain_jobs_and_array_tasks(
        slurm_cluster: SlurmCluster) -> None:
    cluster = slurm_cluster
    cluster.wait_no_jobs()
    plain = cluster.submit(HOLD, user="sgeuser", gres="gpu:2", extra_args=["--job-name=plain"])
    array = cluster.submit(HOLD, user="sgeuser2", gres="gpu:1",
                           extra_args=["--array=3-4", "--account=chemistry"])
    try:
        tasks = wait_until(lambda: (t := cluster.array_task_job_ids(array)) and len(t) == 2
                           and t, 30, "both array tasks split off")
        compare(cluster, [plain, *sorted(tasks.values())], tasks, array)
    finally:
        for jobid in (plain, array):
            cluster.cancel(jobid)
        cluster.wait_no_jobs()
