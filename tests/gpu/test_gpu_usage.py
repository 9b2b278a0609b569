"""Who uses and who holds a GPU (gpu/attribution/usage.py), with /proc written by the test."""

from __future__ import annotations

import os
import pwd
from pathlib import Path

from slurm_gpu_exporter.gpu.attribution.shares import UNATTRIBUTED, GpuTarget
from slurm_gpu_exporter.gpu.attribution.usage import UNKNOWN_USER, UsageReader
from slurm_gpu_exporter.gpu.readings import GpuProcess, ProcessUtilSample
from slurm_gpu_exporter.jobs.job import Job
from tests.gpu.fake_gpu import StubMapper


def reader(tmp_path: Path, jobs: dict[int, str]) -> UsageReader:
    users = UsageReader(tmp_path)
    users.mapper = StubMapper(jobs)  # type: ignore[assignment]
    return users


def test_processes_go_to_their_jobs_and_the_others_to_their_users_unresolved_too(
    tmp_path: Path,
) -> None:
    uid = os.getuid()
    (tmp_path / "30").mkdir()
    (tmp_path / "30" / "status").write_text(f"Name:\tx\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n")
    users = reader(tmp_path, {10: "7", 11: "7", 20: "8"})
    jobs = {"7": Job(jobid="7", uid=1, user="a"), "8": Job(jobid="8", uid=2, user="b")}
    seen: set[int] = set()
    usage = users.usage(
        [GpuProcess(10, 100), GpuProcess(11, 50), GpuProcess(20, None), GpuProcess(30, 7),
         GpuProcess(40, 9)],  # 40 has exited: no /proc entry
        [ProcessUtilSample(10, 1, 20.0), ProcessUtilSample(11, 1, 30.0),
         ProcessUtilSample(30, 1, 5.0)],
        jobs, seen)
    # 40 still counts: its memory was on the GPU when NVML listed it.
    assert usage.processes == {"7": 2, "8": 1, UNATTRIBUTED: 2}
    assert usage.memory == {"7": 150, "8": 0, UNATTRIBUTED: 16}
    assert usage.weight == {"7": 50.0, "8": 0.0, UNATTRIBUTED: 5.0}
    me = pwd.getpwuid(uid).pw_name
    assert usage.unattributed == {me: (1, 7), UNKNOWN_USER: (1, 9)}
    assert usage.unattributed_weight == {me: 5.0, UNKNOWN_USER: 0.0}
    assert seen == {10, 11, 20, 30, 40}


def test_holders_by_minor_or_uuid_and_allocations_follow_the_job(tmp_path: Path) -> None:
    users = reader(tmp_path, {})
    by_index = Job(jobid="7", uid=1, user="a", job_gpus="0-1")
    by_uuid = Job(jobid="8", uid=1, user="a", job_gpus="2", cuda_visible_devices="GPU-c")
    gpu1 = GpuTarget("1", "GPU-b", 1)
    gpu2 = GpuTarget("2", "GPU-c", 2)
    assert users.holders(gpu1, [by_index, by_uuid]) == ["7"]
    assert users.holders(gpu2, [by_index, by_uuid]) == ["8"]
    moved = Job(jobid="7", uid=1, user="a", job_gpus="2")  # its record changed
    assert users.holders(gpu2, [moved]) == ["7"]
    users.forget(seen_pids=set())
    # Each job holds its own parsed allocation: the reader keeps none to forget.
    assert "allocation" in vars(moved) and set(vars(users)) == {"proc_root", "mapper", "_users"}
