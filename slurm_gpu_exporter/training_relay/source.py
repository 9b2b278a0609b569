"""The training relay as one of the agent's sources: who may publish, and what it holds.

``RelayJobs`` tells the relay which job a sending process runs in: its Slurm cgroup
(never its environment, which the user sets), and the job's ``jobid`` and ``user`` as
the job tracker knows them (never from the payload). ``TrainingSource`` runs in each
sample: it hands the tracker's jobs to ``RelayJobs``, drops what the relay holds of
jobs the tracker no longer reports (their linger passed, or they ended while the
agent was down), counts the relay's refusals under the ``training`` error source and
returns the families for the snapshot.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from prometheus_client.metrics_core import Metric

from slurm_gpu_exporter.jobs.job import Job
from slurm_gpu_exporter.jobs.source import SampleContext, SourceDefaults
from slurm_gpu_exporter.node.cgroup import CgroupFS
from slurm_gpu_exporter.node.procfs import PidJobMapper
from slurm_gpu_exporter.node.source_health import SourceErrors
from slurm_gpu_exporter.training_relay import PendingJob, TrainingRelay


class RelayJobs:
    """``job_of_pid``/``job_of_key`` for the relay: a process's job by its cgroup.

    ``update`` runs on the sampler thread and replaces the job map in one assignment;
    the relay thread only reads it, and alone uses the pid mapper (not thread-safe).
    """

    def __init__(self, proc_root: Path, cgroups: CgroupFS | None,
                 mapper: PidJobMapper | None = None) -> None:
        """``cgroups`` says where Slurm's roots are (None: no process is in a job)."""
        self._mapper = mapper or PidJobMapper(proc_root, environ_fallback=False)
        self._cgroups = cgroups
        self._by_key: Mapping[str, tuple[str, str]] = {}
        # Before the sampler thread starts: senders that connect ahead of the first
        # sample wait for their job instead of being refused as outside every job.
        if cgroups is not None:
            self._mapper.slurm_roots = cgroups.proc_roots()

    def update(self, jobs: Iterable[Job]) -> bool:
        """The running jobs a sender may belong to, by job id and by cgroup key, and
        where Slurm's cgroup roots are now (only a process below them is in a job);
        True when the jobs differ from the last update's."""
        if self._cgroups is not None:
            self._mapper.slurm_roots = self._cgroups.proc_roots()
        by_key: dict[str, tuple[str, str]] = {}
        for job in jobs:
            if not job.running:
                continue  # an ended job's processes are gone; its series only linger
            identity = (job.jobid, job.user)
            by_key[job.jobid] = identity
            if job.cgroup is not None:  # a SLUID on Slurm 26.05 cgroup v2
                by_key[job.cgroup.job_key] = identity
        changed = by_key != self._by_key
        self._by_key = by_key
        return changed

    def job_of_pid(self, pid: int) -> tuple[str, str] | PendingJob | None:
        """(jobid, user) of the job whose cgroup holds ``pid``; pending while the
        tracker has not reported that job yet; None for a process in no job."""
        found = self._mapper.job_of(pid)
        if found is None or found.source != "cgroup":
            return None
        return self._by_key.get(found.job_key) or PendingJob(found.job_key)

    def job_of_key(self, key: str) -> tuple[str, str] | None:
        """(jobid, user) of a running job by its id or cgroup key."""
        return self._by_key.get(key)


class TrainingSource(SourceDefaults):
    """What the sampler asks of the training relay once per sample."""

    def __init__(self, relay: TrainingRelay, jobs: RelayJobs, errors: SourceErrors) -> None:
        self.relay = relay
        self.jobs = jobs
        self.errors = errors
        self._counted = relay.error_counts()  # refusals already counted, by reason

    # As a source of the sample: the last, with the tracker's answer as it was.
    name = "training"
    health_names = ("training",)

    def take(self, ctx: SampleContext) -> tuple[Metric, ...]:
        return self.sample(ctx.tracked)

    def failed_part(self) -> tuple[Metric, ...]:
        return ()

    def snapshot_fields(self, part: tuple[Metric, ...]) -> dict[str, Any]:
        return {"training": part}

    def sample(self, jobs: list[Job] | None) -> tuple[Metric, ...]:
        """Sync with the tracker's ``jobs`` (None: the tracker failed this sample, so
        nothing is forgotten) and return the relay's current families."""
        if jobs is not None:
            # Pending connections wait for their job: only new jobs can settle them, so
            # the relay's thread is woken only then, not on every sample.
            if self.jobs.update(jobs):
                self.relay.jobs_changed()
            reported = {job.jobid for job in jobs}
            for jobid in sorted(self.relay.jobs() - reported):
                self.relay.forget(jobid)
        self._count_refusals()
        return tuple(self.relay.families())

    def _count_refusals(self) -> None:
        """Count the refusals since the last sample, once each."""
        counts = self.relay.error_counts()
        new = {reason: n - self._counted.get(reason, 0) for reason, n in counts.items()
               if n > self._counted.get(reason, 0)}
        self._counted = counts
        if new:
            self.errors.count(
                "training",
                f"the training relay refused pushes or connections ({', '.join(sorted(new))}); "
                f"see the limits in docs/training.md",
                n=sum(new.values()))

    def stop(self) -> None:
        """Stop the relay and remove its socket."""
        self.relay.stop()
