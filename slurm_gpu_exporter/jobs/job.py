"""One job as the agent reports it (``Job``), made from the spool record and Slurm's answer."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from slurm_gpu_exporter.exposition.snapshot import JobInfo
from slurm_gpu_exporter.hooks.ids import user_name
from slurm_gpu_exporter.node.cgroup import JobCgroup
from slurm_gpu_exporter.node.slurm.lookup import SlurmJobInfo

if TYPE_CHECKING:
    from slurm_gpu_exporter.jobs.tracked import TrackedJob


@dataclass(frozen=True)
class Job:
    """One job as the agent knows it; what crosses from the tracker to the sampler."""

    jobid: str
    uid: int | None
    user: str
    account: str = ""
    partition: str = ""
    cluster: str = ""
    name: str = ""
    array_job_id: str = ""
    array_task_id: str = ""
    job_gpus: str = ""
    cuda_visible_devices: str = ""
    start_time: float | None = None
    end_time: float | None = None
    source: str = "spool"  # "spool" or "cgroup" (discovered without a record)
    cgroup: JobCgroup | None = None

    @property
    def running(self) -> bool:
        return self.end_time is None

    def info(self) -> JobInfo:
        """The part of the job the snapshot carries to the exposition."""
        return JobInfo(
            jobid=self.jobid, user=self.user, uid=self.uid, account=self.account,
            partition=self.partition, name=self.name, array_job_id=self.array_job_id,
            array_task_id=self.array_task_id, start_time=self.start_time,
            end_time=self.end_time, source=self.source,
        )


def job_of(tracked: TrackedJob, info: SlurmJobInfo | None) -> Job:
    """The job as reported: the spool record first, Slurm's answers for the gaps."""
    record = tracked.record
    if record is not None:
        job = Job(
            jobid=record.jobid,
            uid=record.uid,
            user=record.user or (info.user if info else "") or _user_name(record.uid),
            account=record.account or (info.account if info else ""),
            partition=record.partition or (info.partition if info else ""),
            cluster=record.cluster or (info.cluster if info else ""),
            name=info.name if info else "",
            # slurmd 22.05 gives the prolog no array ids; Slurm knows them.
            array_job_id=record.array_job_id or (info.array_job_id if info else ""),
            array_task_id=record.array_task_id or (info.array_task_id if info else ""),
            job_gpus=record.job_gpus,
            cuda_visible_devices=record.cuda_visible_devices,
            # A record the epilog wrote for a job it found no record of has no start.
            start_time=record.start_time if record.start_time is not None else (
                (info.start_time if info and info.start_time else None)
                or tracked.first_seen),
            source="cgroup" if tracked.discovered else "spool",
        )
    else:
        uid = info.uid if info and info.uid is not None else tracked.uid_from_process
        job = Job(
            jobid=tracked.jobid,
            uid=uid,
            user=(info.user if info and info.user else "") or _user_name(uid),
            account=info.account if info else "",
            partition=info.partition if info else "",
            cluster=info.cluster if info else "",
            name=info.name if info else "",
            array_job_id=info.array_job_id if info else "",
            array_task_id=info.array_task_id if info else "",
            job_gpus=info.job_gpus if info else "",
            start_time=(info.start_time if info and info.start_time else None)
            or tracked.first_seen,
            source="cgroup",
        )
    return replace(job, end_time=tracked.end_time, cgroup=tracked.cgroup)


def _user_name(uid: int | None) -> str:
    if uid is None:
        return ""
    return user_name(uid) or str(uid)
