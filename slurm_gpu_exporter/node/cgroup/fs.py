"""Slurm job cgroups as the kernel shows them: find jobs, read their CPU, memory and pids.

Layouts Slurm creates (paths relative to the cgroup mount):

- cgroup v1 (plugin ``cgroup/v1``), one tree per controller:
  ``/<ctrl>/slurm/uid_<uid>/job_<id>/step_<s>/task_<n>``. Builds configured with
  ``--enable-multiple-slurmd`` (Debian's packages are) name the top directory
  ``slurm_<NodeName>``. ``slurm[_<node>]/system`` holds slurmd's specialised cores,
  not a job. slurmstepd sits in the job-level freezer cgroup and the step-level
  memory/devices/cpuset ones; the tasks sit below it (freezer ``step_<s>``,
  elsewhere ``task_<n>``). cpuacct job cgroups exist only with
  ``JobAcctGatherType=jobacct_gather/cgroup``.
- cgroup v2 (plugin ``cgroup/v2``), one unified tree:
  ``/<slice>/[<node>_]slurmstepd.scope/<job>/step_<s>/{slurm,user/task_<n>}``.
  ``<slice>`` is ``system.slice`` unless cgroup.conf sets ``CgroupSlice`` (Slurm
  25.11+); the ``<node>_`` prefix again comes from multiple-slurmd builds. The
  scope's ``system`` leaf holds slurmstepd's helper, the step's ``slurm`` leaf holds
  slurmstepd itself. ``<job>`` is ``job_<id>`` up to 25.11; from 26.05 it is the
  job's SLUID (``s`` + 13 Crockford base32 digits, e.g. ``sEKNKTV3WPV500``, no
  ``job_`` prefix) unless cgroup.conf sets ``CgroupJobIdPaths=yes`` (26.05.2+).
- Step names: ``step_<n>``, ``step_batch``, ``step_extern``, ``step_interactive``
  and ``step_<n>+<k>`` for component ``k`` of a heterogeneous step (26.05 drops
  the ``+<k>`` when the step carries a SLUID).

A SLUID maps back to the numeric job id through ``SLURM_JOB_SLUID`` next to
``SLURM_JOB_ID`` in the prolog/epilog and task environments, ``squeue -O
JobID,Sluid`` (or ``%s``), ``scontrol -d show job`` (``SLUID=``),
``.jobs[].step_id.sluid`` of ``squeue --json`` and ``.jobs[].sluid`` of ``sacct --json``.

Cost: finding jobs lists only Slurm's own levels (the ``slurm*`` / scope
directories, their ``uid_*`` and job children), and only when inotify told of a
change there since the last listing (watch.py), or a minute passed; when the roots
are looked for again is roots.py's business.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from slurm_gpu_exporter.node.cgroup.files import Reader, SteadyFiles, StepLeaves
from slurm_gpu_exporter.node.cgroup.paths import SlurmRoot
from slurm_gpu_exporter.node.cgroup.roots import RootTracker, cgroup_version
from slurm_gpu_exporter.node.cgroup.v1 import jobs_under_v1, read_v1
from slurm_gpu_exporter.node.cgroup.v2 import V2Reader, jobs_under_v2
from slurm_gpu_exporter.node.cgroup.watch import DirWatch
from slurm_gpu_exporter.node.kernelfile import HeldFiles, read_kernel_file

__all__ = ["CgroupFS", "CgroupGone", "JobCgroup", "JobCgroupStats"]

# job key -> (uid, is_sluid, slurmd instance -> controller -> job dir), as listed.
_Found = dict[str, tuple[int | None, bool, dict[str, dict[str, str]]]]


class CgroupGone(Exception):
    """The job's cgroup vanished while it was being read: the job ended, a normal outcome."""


@dataclass(frozen=True)
class JobCgroup:
    """One job's cgroup directories on this node.

    ``dirs`` maps a v1 controller name (``cpuacct``, ``memory``, ``freezer``...) to
    the job directory in that controller's tree, or ``UNIFIED`` to the v2 job
    directory. ``more_dirs`` holds the same job under further slurmd instances of a
    multiple-slurmd host (one per emulated node); stats add them up (the peak is
    then an upper bound) and count the union of their CPUs.
    """

    job_key: str
    uid: int | None
    is_sluid: bool
    version: int
    dirs: Mapping[str, Path]
    more_dirs: tuple[Mapping[str, Path], ...] = ()


@dataclass(frozen=True)
class JobCgroupStats:
    """What the kernel accounts for one job; a field is None when it could not be read.

    - ``cpu_seconds``: CPU time of the job's cgroup; None where there is no cpuacct
      job cgroup (v1 without jobacct_gather/cgroup): count the processes instead.
    - ``cpus``: CPUs in the job's cpuset.
    - ``memory_used_bytes``: working set, i.e. usage minus inactive file cache
      (v1 ``total_inactive_file``, v2 ``inactive_file``): cache the kernel can drop
      without the job noticing is not counted.
    - ``memory_limit_bytes``: None when unlimited (or unreadable).
    - ``memory_peak_bytes``: the kernel's high-water mark (v1
      ``memory.max_usage_in_bytes``, v2 ``memory.peak``) where the kernel has one.
    - ``oom_kills``: processes of the job killed by the OOM killer.
    - ``pids``: every process of every step of the job, sorted; slurmstepd itself
      (v1 job-level freezer cgroup, v2 ``step_*/slurm`` leaves) is left out, except
      on a v1 node whose only Slurm tree is cpuset.
    """

    cpu_seconds: float | None
    cpus: int | None
    memory_used_bytes: int | None
    memory_limit_bytes: int | None
    memory_peak_bytes: int | None
    oom_kills: int | None
    pids: tuple[int, ...]


def _sum_int(values: Iterable[int | None]) -> int | None:
    present = [v for v in values if v is not None]
    return sum(present) if present else None


def _sum_float(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return sum(present) if present else None


class CgroupFS:
    """Reads Slurm's job cgroups under a cgroup mount (``--cgroup-root``).

    Not thread-safe: one sampler thread owns an instance.
    """

    def __init__(
        self,
        root: Path = Path("/sys/fs/cgroup"),
        *,
        rescan_interval: float = 60.0,
        steady_ttl: float = 60.0,
        held_files: int = 0,
        clock: Callable[[], float] = time.monotonic,
        dir_watch: DirWatch | None = None,
    ) -> None:
        """``rescan_interval``: seconds between searches for Slurm's tree roots;
        ``steady_ttl``: seconds a job's cpuset and memory limit are kept before being
        read again (they do not change while a job runs, short of an admin's hand);
        ``held_files``: how many of the jobs' accounting files may be kept open
        between samples (HeldFiles; 0: every file opened on each read);
        ``dir_watch``: tells whether Slurm's directories changed since listed
        (default: inotify, opened at the first listing)."""
        self.root = Path(root)
        self._clock = clock
        self._roots = RootTracker(self.root, rescan_interval)
        # job key -> (what it was found as, the JobCgroup handed out for it).
        self._jobs: dict[str, tuple[object, JobCgroup]] = {}
        self._steady = SteadyFiles(steady_ttl, clock)
        self._held = HeldFiles(held_files)
        self._read: Reader = self._held.read if held_files > 0 else read_kernel_file
        self._v1_leaves = StepLeaves(clock, read=self._read)
        self._v2 = V2Reader(self._steady, self._read)
        self._live: set[str] = set()  # the job directories found by the last scan
        self._dir_watch = dir_watch if dir_watch is not None else DirWatch()
        self._listed: _Found | None = None  # what the last listing found
        # proc_roots() of the roots list it was made from (a new list on every change).
        self._proc_roots: tuple[object, tuple[SlurmRoot, ...]] = (None, ())

    def version(self) -> int:
        """2 on a pure cgroup v2 mount, else 1 (``roots.cgroup_version``)."""
        return cgroup_version(self.root)

    def slurm_roots(self) -> tuple[Path, ...]:
        """Slurm's tree roots on this node: v1 ``slurm*`` dirs per hierarchy, v2 stepd scopes.

        Empty where Slurm does not use cgroups (or no slurmd has started yet).
        """
        return tuple(Path(path) for _, path in self._roots.current(self._clock()))

    def proc_roots(self) -> tuple[SlurmRoot, ...]:
        """Slurm's tree roots as /proc/<pid>/cgroup names them, per hierarchy: the only
        places where a process's cgroup path may name its job (``job_under_roots``)."""
        roots = self._roots.current(self._clock())
        made_from, made = self._proc_roots
        if made_from is roots:  # asked twice a sample (GPU and relay sources): no change
            return made
        if self._roots.version == 2:
            base = os.fspath(self.root).rstrip("/")
            made = tuple(SlurmRoot(frozenset(), "/" + os.path.relpath(path, base))
                         for _, path in roots)
        else:
            # A v1 root sits right under its hierarchy's mount: "/<ctrl>/slurm_<node>".
            made = tuple(SlurmRoot(controllers, "/" + os.path.basename(path))
                         for controllers, path in roots)
        self._proc_roots = (roots, made)
        return made

    def find_jobs(self, expected: Iterable[str] = ()) -> dict[str, JobCgroup]:
        """Every job with a cgroup on this node, keyed by job key (job id or SLUID).

        ``expected``: keys of jobs the caller knows to run here (spool records) that
        had no cgroup yet; while one is new, a late Slurm root is looked for.
        """
        now = self._clock()
        roots = self._roots.current(now)
        found, stale = self._list_jobs(roots, now)
        new_jobs = self._roots.track_new(now, found, expected)
        if new_jobs and not stale and self._roots.rescan_late():
            found, stale = self._list_jobs(self._roots.roots, now)
        if stale:
            self._roots.forget()
        return self._job_cgroups(found)

    def _list_jobs(
        self, roots: list[tuple[frozenset[str], str]], now: float
    ) -> tuple[_Found, bool]:
        """(job key -> (uid, is_sluid, instance -> controller -> dir), a root vanished);
        the last listing while the roots are the same and inotify told of no change."""
        version = self._roots.version
        watch = self._dir_watch
        # A root's removal or move is an event; cgroupfs cannot rename its parent (v2
        # refuses any rename, a v1 root's parent is its hierarchy's mount point).
        if watch.unchanged((version, tuple(roots)), now) and self._listed is not None:
            return self._listed, False
        # A job has one set of directories per slurmd instance: per v1 "slurm*" name
        # (shared by all controllers) or per v2 scope.
        found: _Found = {}
        stale = False
        for controllers, top in roots:
            if not os.path.isdir(top):
                stale = True
                continue
            instance = top if version == 2 else os.path.basename(top)
            jobs_under = jobs_under_v2 if version == 2 else jobs_under_v1
            for job_key, uid, is_sluid, job_dir in jobs_under(top, watch.watch):
                _, _, instances = found.setdefault(job_key, (uid, is_sluid, {}))
                dirs = instances.setdefault(instance, {})
                for ctrl in controllers:
                    dirs[ctrl] = job_dir
        watch.listed(complete=not stale)
        self._listed = found
        return found, stale

    def _job_cgroups(self, found: _Found) -> dict[str, JobCgroup]:
        version = self._roots.version
        jobs: dict[str, JobCgroup] = {}
        for job_key, (uid, is_sluid, instances) in found.items():
            # Compared as found: dicts are equal whatever their order, so nothing is
            # sorted for a job that did not change.
            signature = (uid, is_sluid, version, instances)
            known = self._jobs.get(job_key)
            # Unchanged jobs keep their JobCgroup: no new objects on every sample.
            if known is not None and known[0] == signature:
                jobs[job_key] = known[1]
                continue
            ordered = tuple(tuple(sorted(instances[name].items())) for name in sorted(instances))
            dirs = [MappingProxyType({c: Path(d) for c, d in inst}) for inst in ordered]
            jobs[job_key] = JobCgroup(
                job_key=job_key,
                uid=uid,
                is_sluid=is_sluid,
                version=version,
                dirs=dirs[0],
                more_dirs=tuple(dirs[1:]),
            )
            self._jobs[job_key] = (signature, jobs[job_key])
        self._jobs = {k: v for k, v in self._jobs.items() if k in jobs}
        live = {d for _, _, insts in found.values() for i in insts.values() for d in i.values()}
        if live != self._live:  # only the files of a job that went are to forget
            self._live = live
            self._v2.keep_only(live)
            self._steady.keep_only(live)
            self._v1_leaves.keep_only(live)
            self._held.keep_only(self._in_live_job)
        return jobs

    def _in_live_job(self, path: str) -> bool:
        """Whether ``path`` lies in (or below) a job directory of the last scan."""
        top = len(os.fspath(self.root))
        d = os.path.dirname(path)
        while d not in self._live:
            if len(d) <= top:
                return False
            d = os.path.dirname(d)
        return True

    def held_files(self) -> list[str]:
        """The paths of the accounting files kept open between samples."""
        return list(self._held)

    def close(self) -> None:
        """Close the files held open and the inotify fd, for a caller done with this
        CgroupFS (the agent's exit stack calls it)."""
        self._held.close()
        self._dir_watch.close()

    def read_stats(self, job: JobCgroup) -> JobCgroupStats:
        """Read one job's accounting; raises CgroupGone when its directory vanished.

        A single missing or odd file leaves its field None instead of failing the job.
        """
        instances = [job.dirs, *job.more_dirs]
        if job.version == 2:
            parts = [self._v2.read(dirs) for dirs in instances]
        else:
            parts = [read_v1(dirs, self._steady, self._v1_leaves, self._read)
                     for dirs in instances]
        # Checked after reading, when a file that is always there was missing: files of
        # an ending job vanish one by one, and partial values are not worth reporting.
        if any(p.missing for p in parts) and not any(
                os.path.isdir(p) for dirs in instances for p in dirs.values()):
            raise CgroupGone(f"cgroup of job {job.job_key} is gone")
        cpus: set[int] = set()
        for p in parts:
            cpus.update(p.cpus or ())
        limits = [p.memory_limit for p in parts if p.memory_limit is not None]
        pids: set[int] = set()
        for p in parts:
            pids.update(p.pids)
        return JobCgroupStats(
            cpu_seconds=_sum_float(p.cpu_seconds for p in parts),
            cpus=len(cpus) if cpus else None,
            memory_used_bytes=_sum_int(p.memory_used for p in parts),
            # The sum is a limit only when every instance has one.
            memory_limit_bytes=sum(limits) if len(limits) == len(parts) else None,
            memory_peak_bytes=_sum_int(p.memory_peak for p in parts),
            oom_kills=_sum_int(p.oom_kills for p in parts),
            pids=tuple(sorted(pids)),
        )
