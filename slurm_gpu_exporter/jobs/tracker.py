"""The job tracker: which jobs this node runs, from the spool and from cgroups.

The spool (written by the prolog/epilog) is the primary source. cgroups fill
the gaps: a job running in a Slurm cgroup with no record (the agent started
late, the prolog is not installed) is discovered and its metadata completed
through the Slurm adapter; a record whose cgroup vanished without an epilog is
finalized after a grace period. Ended jobs stay for ``job_linger`` seconds so
their last values are scraped, then they and their spool records go.

Thread-confined to the sampler.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

from slurm_gpu_exporter.hooks import spool
from slurm_gpu_exporter.jobs.cgroup_jobs import find_cgroup_jobs, uid_from_processes
from slurm_gpu_exporter.jobs.job import Job
from slurm_gpu_exporter.jobs.source import SampleContext, SourceDefaults
from slurm_gpu_exporter.jobs.tracked import (
    TrackedJob,
    cgroup_ino,
    check_with_slurm,
    is_other_cgroup,
)
from slurm_gpu_exporter.node.cgroup import CgroupFS, JobCgroup
from slurm_gpu_exporter.node.slurm.lookup import SlurmMetadata
from slurm_gpu_exporter.node.source_health import SourceErrors
from slurm_gpu_exporter.node.spool_reader import FileKey, SpoolReader

log = logging.getLogger(__name__)

class JobTracker(SourceDefaults):
    """Reconciles spool records, cgroups and Slurm metadata into the current job list."""

    def __init__(
        self,
        spool_dir: str,
        cgroups: CgroupFS | None,
        metadata: SlurmMetadata,
        errors: SourceErrors,
        *,
        proc_root: Path = Path("/proc"),
        job_linger: float = 60.0,
        cgroup_grace: float = 30.0,
        trusted_uids: frozenset[int] = frozenset({0}),
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.spool_dir = spool_dir
        self.spool = SpoolReader(spool_dir, errors, trusted_uids)
        self.cgroups = cgroups
        self.metadata = metadata
        self.errors = errors
        self.proc_root = proc_root
        self.job_linger = job_linger
        self.cgroup_grace = cgroup_grace
        self.trusted_uids = trusted_uids
        self.clock = clock
        self._jobs: dict[str, TrackedJob] = {}
        # job id -> the spool file version that already expired (None: a job that had
        # no record), so that a leftover file or cgroup does not revive it
        self._expired: dict[str, FileKey | None] = {}
        # job id -> inode of the cgroup an expired job had: a cgroup with another one is a
        # new run of a requeued job, not a leftover
        self._expired_cgroups: dict[str, int] = {}

    # -- public -------------------------------------------------------------

    # As a source of the sample: the first, whose jobs every later source sees. Its
    # problems count under the spool (its first read) and Slurm (its look-ups). Its step
    # keeps the name it has in slurm_gpu_exporter_sample_step_duration_seconds.
    name = "registry"
    health_names = ("spool", "slurm")

    def take(self, ctx: SampleContext) -> list[Job]:
        return self.refresh(ctx.now)

    def refresh(self, now: float | None = None) -> list[Job]:
        """Re-read the spool and cgroups; returns the jobs to report, running and lingering.

        ``now``: the sample's time (the sampler's one clock); the tracker's own clock
        when called alone."""
        if now is None:
            now = self.clock()
        records = self.spool.read()
        cgroup_jobs = find_cgroup_jobs(self.cgroups, self.metadata, self.errors, records,
                                       self._jobs)
        self._reconcile(now, records, cgroup_jobs)
        self._fill_metadata(now)
        self._expire(now)
        ordered = sorted(self._jobs.values(), key=lambda t: int(t.jobid))
        return [t.report(self.metadata.get(t.jobid)) for t in ordered]

    # -- reconcile ----------------------------------------------------------

    def _reconcile(
        self,
        now: float,
        records: dict[str, tuple[FileKey, spool.JobRecord]],
        cgroup_jobs: dict[str, JobCgroup] | None,
    ) -> None:
        for jobid, (key, record) in records.items():
            if self._expired.get(jobid) == key:
                continue
            self._expired.pop(jobid, None)
            tracked = self._jobs.get(jobid)
            if tracked is None:
                tracked = self._jobs[jobid] = TrackedJob(jobid, first_seen=now)
            if tracked.record != record:
                if tracked.record is not None and record.end_time is None and (
                    tracked.record.start_time != record.start_time
                ):
                    # The job was requeued: a new prolog record, a new run.
                    tracked = self._new_run(jobid, now, record)
                tracked.record = record
            if record.end_time is not None and tracked.end_time is None:
                tracked.mark_ended(record.end_time, now)

        if cgroup_jobs is None:
            # No cgroup layer, or a scan that failed: a failed scan says nothing about
            # cgroups, so it ends no job and forgets no expired one (its cgroup may still
            # be there, and the next good scan would take it for a new job).
            if self.cgroups is None:
                self._forget_expired(records, {})
            return
        self._forget_expired(records, cgroup_jobs)
        for jobid, cgroup in cgroup_jobs.items():
            tracked = self._jobs.get(jobid)
            if tracked is not None and tracked.end_time is not None and is_other_cgroup(
                cgroup, tracked.cgroup_ino
            ):
                tracked = self._new_run(jobid, now)
            if tracked is None:
                if jobid in self._expired:
                    if not is_other_cgroup(cgroup, self._expired_cgroups.get(jobid)):
                        continue  # its record expired; a cgroup left behind is not a new job
                    tracked = self._new_run(jobid, now)
                else:
                    tracked = self._jobs[jobid] = TrackedJob(jobid, first_seen=now,
                                                           discovered=True)
                    log.info("job %s found in cgroups without a spool record (agent started "
                             "late or prolog not installed); tracking it", jobid)
            if tracked.cgroup_ino is None:
                tracked.cgroup_ino = cgroup_ino(cgroup)
            tracked.cgroup = cgroup
            tracked.cgroup_seen = True
            tracked.cgroup_missing_since = None
        for tracked in self._jobs.values():
            if tracked.jobid in cgroup_jobs or tracked.end_time is not None:
                continue
            tracked.cgroup = None
            if tracked.cgroup_seen:
                if tracked.cgroup_missing_since is None:
                    tracked.cgroup_missing_since = now
                elif now - tracked.cgroup_missing_since >= self.cgroup_grace or (
                    tracked.record is None
                ):
                    # No epilog came (or there is no record to wait for): the job is over.
                    tracked.mark_ended(tracked.cgroup_missing_since, now)
                    log.info("job %s: cgroup gone without an epilog; marked ended", tracked.jobid)

    def _forget_expired(self, records: dict[str, tuple[FileKey, spool.JobRecord]],
                        cgroup_jobs: dict[str, JobCgroup]) -> None:
        """Forget expired jobs once neither their record nor their cgroup is left."""
        gone = [j for j in self._expired if j not in records and j not in cgroup_jobs]
        for jobid in gone:
            del self._expired[jobid]
            self._expired_cgroups.pop(jobid, None)

    def _new_run(self, jobid: str, now: float,
                 record: spool.JobRecord | None = None) -> TrackedJob:
        """A job that ran here runs again: it was requeued onto this node.

        Every new run starts from fresh bookkeeping (its own cgroup identity, start time
        and Slurm metadata), whichever way it was found. With a new prolog ``record``
        that record is the run's. Without one (Slurm 22.05 runs no prolog for a run
        requeued onto the node it ran on, so it shows only as a new cgroup) the ended
        run's record is set aside (a new prolog record would still be taken), and Slurm
        is asked again for the new run's start time.
        """
        if record is None:
            version = self.spool.record_version(jobid)
            if version is not None:
                self._expired[jobid] = version
            log.info("job %s runs again in a new cgroup (requeued); tracking its new run",
                     jobid)
        else:
            log.info("job %s has a new prolog record (requeued); tracking its new run", jobid)
        self._expired_cgroups.pop(jobid, None)
        self.metadata.drop(jobid)
        tracked = self._jobs[jobid] = TrackedJob(jobid, first_seen=now, record=record,
                                               discovered=record is None)
        return tracked

    def _fill_metadata(self, now: float) -> None:
        running = [t for t in self._jobs.values() if t.end_time is None]
        # The prolog never knows the job name, and 22.05 gives it no account either:
        # every job is looked up once (the answer is cached for its life).
        need = [t.jobid for t in running]
        check_state = [t for t in running
                       if t.state_check_due(now, self.cgroups is not None)]
        # A failed look-up is counted by the metadata cache, under the slurm source.
        _, answers = self.metadata.ask(need, force_state=[t.jobid for t in check_state])
        for tracked in check_state:
            check_with_slurm(tracked, answers, self.metadata.unreachable, now)
        for tracked in running:
            if tracked.record is None and tracked.uid_from_process is None:
                tracked.uid_from_process = uid_from_processes(self.cgroups, self.proc_root,
                                                              tracked.cgroup)

    # -- expiry -------------------------------------------------------------

    def _expire(self, now: float) -> None:
        expired = [
            t for t in self._jobs.values()
            if t.ended_at is not None and now - t.ended_at >= self.job_linger
        ]
        if not expired:
            return
        removed = []
        for tracked in expired:
            del self._jobs[tracked.jobid]
            if tracked.cgroup_ino is not None:
                self._expired_cgroups[tracked.jobid] = tracked.cgroup_ino
            # Remembered, so that a leftover file (removal failed) does not revive the job.
            self._expired[tracked.jobid] = self.spool.record_version(tracked.jobid)
            if self._expired[tracked.jobid] is not None:
                removed.append(tracked.jobid)
        self.spool.remove(removed)
        self.metadata.forget(self._jobs)

