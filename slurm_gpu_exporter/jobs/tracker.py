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
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from slurm_gpu_exporter.exposition.snapshot import JobInfo
from slurm_gpu_exporter.hooks import spool
from slurm_gpu_exporter.hooks.ids import user_name
from slurm_gpu_exporter.node.cgroup import CgroupFS, CgroupGone, JobCgroup
from slurm_gpu_exporter.node.procfs import ProcessGone, read_uid
from slurm_gpu_exporter.node.slurm.lookup import SlurmJobInfo, SlurmMetadata
from slurm_gpu_exporter.node.source_health import SourceErrors
from slurm_gpu_exporter.node.spool_reader import FileKey, SpoolReader

log = logging.getLogger(__name__)

# A record whose cgroup was never seen is checked against Slurm after this long,
# then every NEVER_SEEN_RECHECK_S; after NEVER_SEEN_MAX_CHECKS checks in a row where
# Slurm does not know the job (or cannot be asked) the job is taken as ended.
NEVER_SEEN_CHECK_S = 120.0
NEVER_SEEN_RECHECK_S = 60.0
NEVER_SEEN_MAX_CHECKS = 5


@dataclass(frozen=True)
class Job:
    """One job as the agent knows it; what crosses from the registry to the sampler."""

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


@dataclass
class _Tracked:
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

    def mark_ended(self, end_time: float, now: float) -> None:
        """The job ended at ``end_time``; it lingers from ``now``, when the agent learnt it,
        so a job found ended late (after the cgroup grace) still lingers in full."""
        self.end_time = end_time
        self.ended_at = now


class JobTracker:
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
        if metadata.errors is None:  # the look-ups it asks for still count, under "slurm"
            metadata.errors = errors
        self.errors = errors
        self.proc_root = proc_root
        self.job_linger = job_linger
        self.cgroup_grace = cgroup_grace
        self.trusted_uids = trusted_uids
        self.clock = clock
        self._jobs: dict[str, _Tracked] = {}
        # job id -> the spool file version that already expired (None: a job that had
        # no record), so that a leftover file or cgroup does not revive it
        self._expired: dict[str, FileKey | None] = {}
        # job id -> inode of the cgroup an expired job had: a cgroup with another one is a
        # new run of a requeued job, not a leftover
        self._expired_cgroups: dict[str, int] = {}

    # -- public -------------------------------------------------------------

    def refresh(self) -> list[Job]:
        """Re-read the spool and cgroups; returns the jobs to report, running and lingering."""
        now = self.clock()
        records = self.spool.read()
        cgroup_jobs = self._find_cgroup_jobs(records)
        self._reconcile(now, records, cgroup_jobs)
        self._fill_metadata(now)
        self._expire(now)
        ordered = sorted(self._jobs.values(), key=lambda t: int(t.jobid))
        return [_job_of(t, self.metadata.get(t.jobid)) for t in ordered]

    # -- cgroups ------------------------------------------------------------

    def _find_cgroup_jobs(
        self, records: dict[str, tuple[FileKey, spool.JobRecord]]
    ) -> dict[str, JobCgroup] | None:
        if self.cgroups is None:
            return None
        # Running records whose cgroup has not shown yet: their cgroup may sit under a
        # Slurm root that appeared after the last search.
        expected = [
            key
            for jobid, (_, record) in records.items()
            if record.end_time is None and not getattr(self._jobs.get(jobid), "cgroup_seen", False)
            for key in (jobid, record.sluid)
            if key
        ]
        try:
            found = self.cgroups.find_jobs(expected)
        except OSError as exc:
            self.errors.count("cgroup", f"cannot scan cgroups under {self.cgroups.root}: {exc}")
            return None
        jobs = {key: job for key, job in found.items() if not job.is_sluid}
        sluids = [key for key, job in found.items() if job.is_sluid]
        if sluids:
            # Slurm 26.05 names v2 job directories by SLUID: join on the prolog's record,
            # else ask Slurm (scontrol accepts a SLUID); until then the job waits.
            by_sluid = {r.sluid: jobid for jobid, (_, r) in records.items() if r.sluid}
            unknown = [k for k in sluids if k not in by_sluid]
            self.metadata.refresh(unknown)
            for key in sluids:
                info = self.metadata.get(key)
                jobid = by_sluid.get(key) or (info.jobid if info else None)
                if jobid:
                    jobs[jobid] = found[key]
        return jobs

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
                tracked = self._jobs[jobid] = _Tracked(jobid, first_seen=now)
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
            if tracked is not None and tracked.end_time is not None and _is_other_cgroup(
                cgroup, tracked.cgroup_ino
            ):
                tracked = self._new_run(jobid, now)
            if tracked is None:
                if jobid in self._expired:
                    if not _is_other_cgroup(cgroup, self._expired_cgroups.get(jobid)):
                        continue  # its record expired; a cgroup left behind is not a new job
                    tracked = self._new_run(jobid, now)
                else:
                    tracked = self._jobs[jobid] = _Tracked(jobid, first_seen=now,
                                                           discovered=True)
                    log.info("job %s found in cgroups without a spool record (agent started "
                             "late or prolog not installed); tracking it", jobid)
            if tracked.cgroup_ino is None:
                tracked.cgroup_ino = _cgroup_ino(cgroup)
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
                 record: spool.JobRecord | None = None) -> _Tracked:
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
        tracked = self._jobs[jobid] = _Tracked(jobid, first_seen=now, record=record,
                                               discovered=record is None)
        return tracked

    def _fill_metadata(self, now: float) -> None:
        running = [t for t in self._jobs.values() if t.end_time is None]
        # The prolog never knows the job name, and 22.05 gives it no account either:
        # every job is looked up once (the answer is cached for its life).
        need = [t.jobid for t in running]
        check_state = [t for t in running if self._state_check_due(t, now)]
        # A failed look-up is counted by the metadata cache, under the slurm source.
        self.metadata.refresh(need, force_state=[t.jobid for t in check_state])
        for tracked in check_state:
            _check_with_slurm(tracked, self.metadata, now)
        for tracked in running:
            if tracked.record is None and tracked.uid_from_process is None:
                tracked.uid_from_process = self._uid_from_processes(tracked.cgroup)

    def _state_check_due(self, tracked: _Tracked, now: float) -> bool:
        """A record whose cgroup never showed is due for a check with Slurm."""
        if tracked.record is None or tracked.cgroup_seen or self.cgroups is None:
            return False
        if tracked.next_state_check is None:
            tracked.next_state_check = tracked.first_seen + NEVER_SEEN_CHECK_S
        if now < tracked.next_state_check:
            return False
        tracked.next_state_check = now + NEVER_SEEN_RECHECK_S
        return True

    def _uid_from_processes(self, cgroup: JobCgroup | None) -> int | None:
        """The job's uid from its cgroup path (v1) or its first process not run by root."""
        if cgroup is None or cgroup.uid is not None:
            return None if cgroup is None else cgroup.uid
        assert self.cgroups is not None
        try:
            pids = self.cgroups.read_stats(cgroup).pids
        except (CgroupGone, OSError):
            return None
        for pid in pids:
            try:
                uid = read_uid(self.proc_root, pid)
            except (ProcessGone, OSError):
                continue
            if uid != 0:  # the extern step's sleep runs as root
                return uid
        return None

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

    # -- output -------------------------------------------------------------

def _check_with_slurm(tracked: _Tracked, metadata: SlurmMetadata, now: float) -> None:
    """End a job without a cgroup that Slurm reports finished, or keeps not knowing."""
    answered = tracked.jobid in metadata.last_answers
    info = metadata.last_answers.get(tracked.jobid)
    if info is not None and info.finished:
        tracked.mark_ended(now, now)
        log.info("job %s: Slurm reports it %s and it never had a cgroup here; "
                 "marked ended", tracked.jobid, info.state)
        return
    if info is not None:
        tracked.failed_state_checks = 0  # Slurm still runs it: keep waiting
        return
    if not answered and not metadata.unreachable:
        return  # not asked this time (too many look-ups at once): not a failed check
    tracked.failed_state_checks += 1
    if tracked.failed_state_checks < NEVER_SEEN_MAX_CHECKS:
        return
    tracked.mark_ended(now, now)
    why = "Slurm no longer knows it" if answered else "Slurm could not be asked"
    log.warning("job %s: never had a cgroup here and %s after %d checks; marked ended",
                tracked.jobid, why, tracked.failed_state_checks)



def _job_of(tracked: _Tracked, info: SlurmJobInfo | None) -> Job:
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


def _cgroup_ino(cgroup: JobCgroup) -> int | None:
    """Inode of one of the job's cgroup directories: a re-created cgroup gets a new one."""
    for path in sorted(cgroup.dirs.values()):
        try:
            return os.stat(path).st_ino
        except OSError:
            continue
    return None


def _is_other_cgroup(cgroup: JobCgroup, known_ino: int | None) -> bool:
    """True when ``cgroup`` is not the directory the job had (which may be left behind)."""
    if known_ino is None:
        return False
    ino = _cgroup_ino(cgroup)
    return ino is not None and ino != known_ino


def _user_name(uid: int | None) -> str:
    if uid is None:
        return ""
    return user_name(uid) or str(uid)
