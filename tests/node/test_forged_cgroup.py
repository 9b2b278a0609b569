"""A process in a look-alike cgroup made outside Slurm's roots is in no job.

A user whose systemd manager delegates a subtree (``user@UID.service``,
``Delegate=yes``) can make ``…/slurmstepd.scope/job_<victim>/…`` there, or
``…/slurm/uid_<uid>/job_<victim>/…`` on v1, and move a process into it. The test
makes such cgroups for real on this node's hierarchies (a v1 controller, the v1
``name=systemd`` tree, the v2 unified tree), puts a real process in one and asks the
relay's job map and the GPU usage reader, both told Slurm's roots by the real
``CgroupFS`` of ``/sys/fs/cgroup``.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurm_gpu_exporter.gpu.attribution.shares import UNATTRIBUTED
from slurm_gpu_exporter.gpu.attribution.usage import UsageReader
from slurm_gpu_exporter.gpu.readings import GpuProcess
from slurm_gpu_exporter.jobs.job import Job
from slurm_gpu_exporter.node.cgroup import CgroupFS
from slurm_gpu_exporter.training_relay.source import RelayJobs
from tests.support import require

pytestmark = [pytest.mark.process]

CGROUP = Path("/sys/fs/cgroup")
PROC = Path("/proc")
VICTIM = Job(jobid="4242", uid=1002, user="victim")

# hierarchy under /sys/fs/cgroup -> the forged path below the test's own top directory
FORGERIES = {
    "freezer": "slurm/uid_1002/job_4242/step_0/task_0",
    "systemd": "user@1000.service/slurmstepd.scope/job_4242/step_0/user/task_0",
    "unified": "user@1000.service/slurmstepd.scope/job_4242/step_0/user/task_0",
}


@contextlib.contextmanager
def process_in_cgroup(hierarchy: str, forged: str) -> Iterator[int]:
    """A real ``sleep`` moved into a real cgroup ``<hierarchy>/sge-forge-<pid>/<forged>``."""
    base = CGROUP / hierarchy
    require(os.geteuid() == 0, "making cgroups needs root")
    require((base / "cgroup.procs").exists(), f"no cgroup hierarchy mounted at {base}")
    top = base / f"sge-forge-{os.getpid()}"
    leaf = top / forged
    proc = subprocess.Popen(["sleep", "60"])
    try:
        leaf.mkdir(parents=True)
        (leaf / "cgroup.procs").write_text(f"{proc.pid}\n")
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()
        for directory in [leaf, *leaf.parents]:
            if directory == base:
                break
            with contextlib.suppress(FileNotFoundError):
                directory.rmdir()


@pytest.mark.parametrize("hierarchy", sorted(FORGERIES))
def test_a_process_in_a_look_alike_cgroup_outside_slurms_roots_is_in_no_job(
        hierarchy: str) -> None:
    with process_in_cgroup(hierarchy, FORGERIES[hierarchy]) as pid:
        cgroups = CgroupFS(CGROUP)
        lines = (PROC / str(pid) / "cgroup").read_text()
        assert "job_4242" in lines  # the forgery is in place

        relay_jobs = RelayJobs(PROC, cgroups)
        relay_jobs.update([VICTIM])
        assert relay_jobs.job_of_pid(pid) is None  # cannot push as the victim's job

        users = UsageReader(PROC)
        users.mapper.slurm_roots = cgroups.proc_roots()  # as GpuSampler.sample does
        assert not users.mapper.environ_fallback, "off on a node with Slurm cgroups"
        usage = users.usage([GpuProcess(pid, 1 << 20)], [], {"4242": VICTIM}, set())
        # Its GPU use stays outside every job, where the unattributed alert sees it.
        assert usage.processes == {UNATTRIBUTED: 1}
