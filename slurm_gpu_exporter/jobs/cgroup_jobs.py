"""What the job tracker learns from cgroups: which jobs have one, and the uid of a job
that has no spool record."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from slurm_gpu_exporter.hooks import spool
from slurm_gpu_exporter.jobs.tracked import TrackedJob
from slurm_gpu_exporter.node.cgroup import CgroupFS, CgroupGone, JobCgroup
from slurm_gpu_exporter.node.procfs import ProcessGone, read_uid
from slurm_gpu_exporter.node.slurm.lookup import SlurmMetadata
from slurm_gpu_exporter.node.source_health import SourceErrors
from slurm_gpu_exporter.node.spool_reader import FileKey


def find_cgroup_jobs(
    cgroups: CgroupFS | None,
    metadata: SlurmMetadata,
    errors: SourceErrors,
    records: dict[str, tuple[FileKey, spool.JobRecord]],
    tracked: Mapping[str, TrackedJob],
) -> dict[str, JobCgroup] | None:
    """Jobs with a cgroup here by job id (SLUID directories joined to their job); None
    without a cgroup layer or when the scan failed (counted under ``cgroup``)."""
    if cgroups is None:
        return None
    # Running records whose cgroup has not shown yet: their cgroup may sit under a
    # Slurm root that appeared after the last search.
    expected = [
        key
        for jobid, (_, record) in records.items()
        if record.end_time is None and not getattr(tracked.get(jobid), "cgroup_seen", False)
        for key in (jobid, record.sluid)
        if key
    ]
    try:
        found = cgroups.find_jobs(expected)
    except OSError as exc:
        errors.count("cgroup", f"cannot scan cgroups under {cgroups.root}: {exc}")
        return None
    jobs = {key: job for key, job in found.items() if not job.is_sluid}
    sluids = [key for key, job in found.items() if job.is_sluid]
    if sluids:
        # Slurm 26.05 names v2 job directories by SLUID: join on the prolog's record,
        # else ask Slurm (scontrol accepts a SLUID); until then the job waits.
        by_sluid = {r.sluid: jobid for jobid, (_, r) in records.items() if r.sluid}
        unknown = [k for k in sluids if k not in by_sluid]
        metadata.refresh(unknown)
        for key in sluids:
            info = metadata.get(key)
            jobid = by_sluid.get(key) or (info.jobid if info else None)
            if jobid:
                jobs[jobid] = found[key]
    return jobs


def uid_from_processes(cgroups: CgroupFS | None, proc_root: Path,
                       cgroup: JobCgroup | None) -> int | None:
    """The job's uid from its cgroup path (v1) or its first process not run by root."""
    if cgroup is None or cgroup.uid is not None:
        return None if cgroup is None else cgroup.uid
    assert cgroups is not None
    try:
        pids = cgroups.read_stats(cgroup).pids
    except (CgroupGone, OSError):
        return None
    for pid in pids:
        try:
            uid = read_uid(proc_root, pid)
        except (ProcessGone, OSError):
            continue
        if uid != 0:  # the extern step's sleep runs as root
            return uid
    return None
