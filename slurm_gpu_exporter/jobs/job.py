"""One job as the agent reports it (``Job``): the spool record's description, filled
field by field from Slurm's answer."""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from slurm_gpu_exporter.exposition.snapshot import JobInfo
from slurm_gpu_exporter.hooks.ids import user_name
from slurm_gpu_exporter.model.job import GPU_FIELDS, JobDescription, describe
from slurm_gpu_exporter.node.cgroup import JobCgroup
from slurm_gpu_exporter.node.slurm.lookup import SlurmJobInfo

if TYPE_CHECKING:
    from slurm_gpu_exporter.jobs.tracked import TrackedJob


@dataclass(frozen=True)
class Job(JobInfo):
    """One job as the agent knows it; what crosses from the tracker to the sampler."""

    cgroup: JobCgroup | None = None

    def info(self) -> JobInfo:
        """The part of the job the snapshot carries to the exposition (made once per job:
        the tracker hands out an unchanged job's same object every sample)."""
        return self._info

    @functools.cached_property
    def _info(self) -> JobInfo:
        return describe(self, JobInfo, end_time=self.end_time, source=self.source)


def job_of(tracked: TrackedJob, info: SlurmJobInfo | None) -> Job:
    """The job as reported: the spool record first, Slurm's answers for the gaps."""
    slurm = None
    if info is not None:
        slurm = describe(info)
        if not slurm.start_time:  # Slurm prints 0 for a start it does not know
            slurm = replace(slurm, start_time=None)
    record = tracked.record
    if record is not None:
        job = describe(record)
        if slurm is not None:
            # slurmd's GPU fields are the allocation as given; Slurm's answer never
            # stands in for them.
            job = job.filled_from(slurm, keep=GPU_FIELDS)
        source = "cgroup" if tracked.discovered else "spool"
    else:
        job = describe(slurm) if slurm is not None else JobDescription(jobid=tracked.jobid)
        job = replace(job, jobid=tracked.jobid)
        if job.uid is None:
            job = replace(job, uid=tracked.uid_from_process)
        source = "cgroup"
    # A record the epilog wrote for a job it found no record of has no start.
    if job.start_time is None:
        job = replace(job, start_time=tracked.first_seen)
    if not job.user:
        job = replace(job, user=_user_name(job.uid))
    return describe(job, Job, end_time=tracked.end_time, source=source, cgroup=tracked.cgroup)


def _user_name(uid: int | None) -> str:
    if uid is None:
        return ""
    return user_name(uid) or str(uid)
