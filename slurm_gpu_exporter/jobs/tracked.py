"""The job tracker's bookkeeping behind each job, the ``Job`` made from it (``job_of``), and
the checks it makes with Slurm."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, replace

from slurm_gpu_exporter.hooks import spool
from slurm_gpu_exporter.hooks.ids import user_name
from slurm_gpu_exporter.jobs.job import Job
from slurm_gpu_exporter.model.job import GPU_FIELDS, JobDescription, describe
from slurm_gpu_exporter.node.cgroup import JobCgroup
from slurm_gpu_exporter.node.slurm.lookup import SlurmJobInfo

log = logging.getLogger(__name__)

# A record whose cgroup was never seen is checked against Slurm after this long,
# then every NEVER_SEEN_RECHECK_S; after NEVER_SEEN_MAX_CHECKS checks in a row where
# Slurm does not know the job (or cannot be asked) the job is taken as ended.
NEVER_SEEN_CHECK_S = 120.0
NEVER_SEEN_RECHECK_S = 60.0
NEVER_SEEN_MAX_CHECKS = 5


@dataclass
class TrackedJob:
    """Mutable bookkeeping behind one Job."""

    jobid: str
    record: spool.JobRecord | None = None
    first_seen: float = 0.0
    cgroup: JobCgroup | None = None
    cgroup_seen: bool = False
    cgroup_missing_since: float | None = None
    end_time: float | None = None
    uid_from_process: int | None = None
    discovered: bool = False  # found in cgroups before any record
    ended_at: float | None = None  # when the agent learnt the job ended (linger counts from it)
    cgroup_ino: int | None = None  # inode of the job's cgroup: a requeued run gets another
    next_state_check: float | None = None  # a record without a cgroup: next check with Slurm
    failed_state_checks: int = 0  # checks in a row where Slurm did not know the job
    reported: Job | None = None  # the last Job handed out, reused while it is unchanged
    reported_from: tuple[object, ...] = ()  # what it was built from (report)

    def report(self, info: SlurmJobInfo | None) -> Job:
        """The job as reported, with ``info`` Slurm's answer; built again only when what
        it is built from changed. An unchanged job is the same object as last time, so
        what was derived from it once (its GPU allocation, its snapshot part) is not
        derived again. The record and the answer stay the same objects while unchanged,
        so the comparison is mostly identity checks."""
        inputs = (info, self.record, self.discovered, self.uid_from_process,
                  self.first_seen, self.end_time, self.cgroup)
        if self.reported is not None and inputs == self.reported_from:
            return self.reported
        job = job_of(self, info)
        self.reported_from = inputs
        if self.reported is None or self.reported != job:
            self.reported = job
        return self.reported

    def mark_ended(self, end_time: float, now: float) -> None:
        """The job ended at ``end_time``; it lingers from ``now``, when the agent learnt it,
        so a job found ended late (after the cgroup grace) still lingers in full."""
        self.end_time = end_time
        self.ended_at = now

    def state_check_due(self, now: float, has_cgroups: bool) -> bool:
        """A record whose cgroup never showed is due for a check with Slurm."""
        if self.record is None or self.cgroup_seen or not has_cgroups:
            return False
        if self.next_state_check is None:
            self.next_state_check = self.first_seen + NEVER_SEEN_CHECK_S
        if now < self.next_state_check:
            return False
        self.next_state_check = now + NEVER_SEEN_RECHECK_S
        return True


def check_with_slurm(tracked: TrackedJob, answers: Mapping[str, SlurmJobInfo | None],
                     unreachable: bool, now: float) -> None:
    """End a job without a cgroup that Slurm reports finished, or keeps not knowing.

    ``answers``: what this sample's look-ups learnt; ``unreachable``: Slurm could not be
    asked (look-ups paused after a failure)."""
    answered = tracked.jobid in answers
    info = answers.get(tracked.jobid)
    if info is not None and info.finished:
        tracked.mark_ended(now, now)
        log.info("job %s: Slurm reports it %s and it never had a cgroup here; "
                 "marked ended", tracked.jobid, info.state)
        return
    if info is not None:
        tracked.failed_state_checks = 0  # Slurm still runs it: keep waiting
        return
    if not answered and not unreachable:
        return  # not asked this time (too many look-ups at once): not a failed check
    tracked.failed_state_checks += 1
    if tracked.failed_state_checks < NEVER_SEEN_MAX_CHECKS:
        return
    tracked.mark_ended(now, now)
    why = "Slurm no longer knows it" if answered else "Slurm could not be asked"
    log.warning("job %s: never had a cgroup here and %s after %d checks; marked ended",
                tracked.jobid, why, tracked.failed_state_checks)


def cgroup_ino(cgroup: JobCgroup) -> int | None:
    """Inode of one of the job's cgroup directories: a re-created cgroup gets a new one."""
    for path in sorted(cgroup.dirs.values()):
        try:
            return os.stat(path).st_ino
        except OSError:
            continue
    return None


def is_other_cgroup(cgroup: JobCgroup, known_ino: int | None) -> bool:
    """True when ``cgroup`` is not the directory the job had (which may be left behind)."""
    if known_ino is None:
        return False
    ino = cgroup_ino(cgroup)
    return ino is not None and ino != known_ino


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
