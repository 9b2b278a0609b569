"""Smoke test of the real one-node Slurm cluster the integration tests run on."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support import wait_until
from tests.support.slurmcluster import SlurmCluster

pytestmark = pytest.mark.every_release

# Controllers in which Slurm (cgroup/v1, proctrack+task cgroup) makes
# job directories; cpuacct only with JobAcctGatherType=jobacct_gather/cgroup.
JOB_CONTROLLERS = {"cpuset", "memory", "devices", "freezer"}

GPU_JOB = """#!/bin/sh
# Opening a stand-in device node: ENXIO (no driver) when the devices cgroup allows it,
# EPERM when it denies it.
for n in 0 1 2 3; do
    if dd if=/dev/nvidia$n of=/dev/null count=1 2>&1 | grep -q 'not permitted'; then
        echo "nvidia$n denied"
    else
        echo "nvidia$n allowed"
    fi
done
echo "CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES"
echo ready
exec sleep 60
"""


def _wait_for_sole_sleep(cluster: SlurmCluster, jobid: int, timeout: float = 10.0) -> int:
    """The batch step's one process once `exec sleep` replaced the batch shell."""
    pids: set[int] = set()

    def sole_sleep() -> int | None:
        nonlocal pids
        pids = cluster.job_pids(jobid, "batch")
        if len(pids) != 1:
            return None
        (pid,) = pids
        try:
            return pid if Path(f"/proc/{pid}/comm").read_text().strip() == "sleep" else None
        except FileNotFoundError:
            return None

    return wait_until(sole_sleep, timeout, f"the sleep alone in job {jobid}'s batch step",
                      log=lambda: f"batch step of job {jobid} is {pids}")


@pytest.mark.slurm
def test_gpu_job_of_normal_user_runs_in_its_job_cgroup_with_two_visible_gpus(
    slurm_cluster: SlurmCluster,
) -> None:
    cluster = slurm_cluster
    uid = cluster.uid("sgeuser")
    jobid = cluster.submit(GPU_JOB, user="sgeuser", gres="gpu:2")
    try:
        cluster.wait_state(jobid, "RUNNING", timeout=30)
        cluster.wait_for_process(jobid, step="batch", timeout=15)
        out = cluster.wait_output(jobid, "ready\n", timeout=15)
        pid = _wait_for_sole_sleep(cluster, jobid)

        expected = set(JOB_CONTROLLERS)
        if cluster.jobacct == "cgroup":
            expected.add("cpuacct")
        assert cluster.job_controllers(jobid) == expected
        for controller in expected:
            step = cluster.expected_job_cgroup_dir(jobid, uid, controller) / "step_batch"
            assert step.is_dir(), step
        # The extern step (PrologFlags=Contain) holds the job from allocation on.
        assert (
            cluster.expected_job_cgroup_dir(jobid, uid, "freezer").joinpath("step_extern").is_dir()
        )

        assert os.stat(f"/proc/{pid}").st_uid == uid
        cgroups = cluster.process_cgroups(pid)
        prefix = f"/{cluster.cgroup_prefix}/uid_{uid}/job_{jobid}/step_batch"
        assert cgroups["freezer"] == prefix
        assert cgroups["memory"] == f"{prefix}/task_0"

        env = cluster.process_environ(pid)
        assert len(env["CUDA_VISIBLE_DEVICES"].split(",")) == 2
        # CUDA_VISIBLE_DEVICES is renumbered from 0 inside the job (ConstrainDevices);
        # SLURM_JOB_GPUS holds the real device minors, and only those may be opened.
        job_gpus = env["SLURM_JOB_GPUS"].split(",")
        allowed = {line.split()[0] for line in out.splitlines() if line.endswith(" allowed")}
        assert allowed == {f"nvidia{n}" for n in job_gpus}, out
    finally:
        cluster.cancel(jobid)
    assert cluster.wait_finished(jobid, timeout=30) == "CANCELLED"
