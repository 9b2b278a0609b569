"""One job as the agent reports it (``Job``): the spool record's description, filled
field by field from Slurm's answer (made from the tracker's bookkeeping by
``jobs.tracked.job_of``)."""

from __future__ import annotations

import functools
from dataclasses import dataclass

from slurm_gpu_exporter.exposition.snapshot import JobInfo
from slurm_gpu_exporter.model.job import describe
from slurm_gpu_exporter.node.cgroup import JobCgroup


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
