"""The prolog's record on every Slurm release, as slurmd runs it: what it holds against
what the controller says of the same job, with the prolog run by slurmd itself and, from
24.05 on, also inside the job's extern step (``PrologFlags=RunInJob``).

The truth is the test's own: what it submitted, and ``scontrol -o -d show job`` as this
module parses it (not the agent's parser).
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from tests.support import wait_until
from tests.support.slurmcluster import DEFAULT_PROLOG_FLAGS, RUN_IN_JOB, SlurmCluster

pytestmark = [pytest.mark.process, pytest.mark.slurm, pytest.mark.every_release]

SHORT = "#!/bin/sh\nexec sleep 8\n"


def controller_view(cluster: SlurmCluster, jobid: int) -> dict[str, str]:
    """The job's fields from ``scontrol -o -d show job``: the first value of each key,
    and GPU_IDX (this node's GRES indices, from the per-node ``GRES=...(IDX:...)``)."""
    out = cluster.run(["scontrol", "-o", "-d", "show", "job", str(jobid)])
    fields: dict[str, str] = {}
    for token in out.split():
        key, sep, value = token.partition("=")
        if sep and key not in fields:
            fields[key] = value
    idx = re.search(r"\bGRES=gpu[^ ]*\(IDX:([0-9,-]+)\)", out)
    fields["GPU_IDX"] = idx.group(1) if idx else ""
    return fields


def expand(indices: str) -> str:
    """``0-1,3`` -> ``0,1,3``."""
    out: list[str] = []
    for part in filter(None, indices.split(",")):
        lo, _, hi = part.partition("-")
        out.extend(str(i) for i in range(int(lo), int(hi or lo) + 1))
    return ",".join(out)


def check_record(cluster: SlurmCluster, jobid: int, user: str, account: str) -> None:
    record = wait_until(lambda: cluster.gpu_record(jobid), 20, f"job {jobid}'s prolog record",
                        log=cluster.log_tail)
    truth = controller_view(cluster, jobid)
    assert record["jobid"] == str(jobid)
    assert record["user"] == user
    assert record["uid"] == cluster.uid(user)
    assert record["account"] == account == truth["Account"]
    assert record["partition"] == truth["Partition"]
    assert record["cluster"] == cluster.cluster_name
    assert record["job_gpus"] == expand(truth["GPU_IDX"])
    assert len(record["job_gpus"].split(",")) == 2
    # SLURM_JOB_SLUID from 25.11 on, the SLUID the controller gives the job.
    if cluster.version >= (25, 11):
        assert re.fullmatch(r"s[0-9A-Z]{13}", record["sluid"]), record
        if "SLUID" in truth:  # scontrol prints it from 26.05 on
            assert record["sluid"] == truth["SLUID"], (record, truth)
    else:
        assert not record.get("sluid"), record


def run_one(cluster: SlurmCluster) -> None:
    cluster.wait_no_jobs()
    jobid = cluster.submit(SHORT, user="sgeuser2", gres="gpu:2",
                           extra_args=["--job-name=a b;c=d'e", "--account=chemistry"])
    try:
        cluster.wait_state(jobid, "RUNNING", timeout=30)
        check_record(cluster, jobid, "sgeuser2", "chemistry")
        cluster.wait_finished(jobid, timeout=60)
    finally:
        cluster.cancel(jobid)
    # The epilog of a job that ended on its own marks the record ended.
    wait_until(lambda: (r := cluster.gpu_record(jobid)) and r.get("end_time"), 60,
               f"job {jobid}'s epilog mark", log=cluster.log_tail)


def test_prolog_record_holds_what_the_controller_says(slurm_cluster: SlurmCluster) -> None:
    run_one(slurm_cluster)


@pytest.fixture
def run_in_job(slurm_cluster: SlurmCluster) -> Iterator[SlurmCluster]:
    """The cluster with PrologFlags=RunInJob (24.05+) for one test, then as it was."""
    if slurm_cluster.version < (24, 5):
        pytest.skip(f"PrologFlags=RunInJob came with 24.05 (this is {slurm_cluster.release})")
    slurm_cluster.wait_no_jobs()
    slurm_cluster.up(prolog_flags=RUN_IN_JOB)
    try:
        yield slurm_cluster
    finally:
        slurm_cluster.wait_no_jobs()
        slurm_cluster.up(prolog_flags=DEFAULT_PROLOG_FLAGS)


def test_prolog_in_the_jobs_extern_step_writes_the_same_record(run_in_job: SlurmCluster
                                                               ) -> None:
    assert "RunInJob" in run_in_job.run(["scontrol", "show", "config"])
    run_one(run_in_job)
