"""No text a user gives sbatch can stand for a Slurm field in the agent's look-up.

Real jobs on the one-node cluster, submitted by sgeuser with an output path and a
job name made to look like ``Key=value`` fields of ``scontrol -o``; the agent's CLI
look-up (``SlurmCli``) must report the real user, uid, account, name and GPUs.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator

import pytest

from slurm_gpu_exporter.node.slurm.lookup import SlurmCli, SlurmJobInfo
from tests.support.slurmcluster import ACCOUNTS, SlurmCluster, SlurmError

pytestmark = [pytest.mark.process, pytest.mark.slurm]

# An account the job's user is not in (with accounting on, its real one is the user's
# default account, physics).
FORGED = "Account=victims UserId=victim(1002) JobName=innocent GRES=gpu:8(IDX:0-7)"


@contextlib.contextmanager
def running_job(cluster: SlurmCluster, *args: str) -> Iterator[int]:
    jobid = cluster.submit("sleep 30\n", gres="gpu:1", extra_args=args)
    try:
        cluster.wait_state(jobid, "RUNNING", timeout=30)
        yield jobid
    finally:
        cluster.cancel(jobid)
        with contextlib.suppress(SlurmError):
            cluster.wait_finished(jobid, timeout=30)


def look_up(cluster: SlurmCluster, monkeypatch: pytest.MonkeyPatch, jobid: int
            ) -> SlurmJobInfo:
    for key, value in cluster.env.items():
        monkeypatch.setenv(key, value)
    info = SlurmCli(cluster.node_name)(str(jobid))
    assert info is not None
    return info


def assert_real_identity(cluster: SlurmCluster, info: SlurmJobInfo) -> None:
    assert (info.user, info.uid) == ("sgeuser", cluster.uid("sgeuser"))
    assert info.account == ACCOUNTS["sgeuser"][0] and info.state == "RUNNING"
    assert re.fullmatch(r"\d", info.job_gpus), info.job_gpus  # its one GPU, not 0-7


def test_fields_forged_in_the_output_path_are_not_read(
        slurm_cluster: SlurmCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    stdout = f"/tmp/sge-forged {FORGED}"
    try:
        with running_job(slurm_cluster, "--job-name=honest", f"--output={stdout}") as jobid:
            info = look_up(slurm_cluster, monkeypatch, jobid)
            assert_real_identity(slurm_cluster, info)
            assert info.name == "honest"
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(stdout)


def test_a_job_name_that_looks_like_fields_is_read_whole_from_the_json(
        slurm_cluster: SlurmCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    name = f"x {FORGED}"
    with running_job(slurm_cluster, f"--job-name={name}") as jobid:
        info = look_up(slurm_cluster, monkeypatch, jobid)
        assert_real_identity(slurm_cluster, info)
        assert info.name == name
