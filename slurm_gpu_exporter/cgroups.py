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
directories, their ``uid_*`` and job children). Where those roots are is looked up
again every ``rescan_interval`` seconds, when one vanishes, and on every call while
a job is new (seen, or expected by the caller, for less than ``NEW_JOB_WINDOW_S``):
slurmd makes some v1 roots (cpuset, devices) only at the first job after it starts,
and a new scope appears with its first job. On v1 such a call lists only the
hierarchies that have no Slurm root yet.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

__all__ = [
    "UNIFIED",
    "CgroupFS",
    "CgroupGone",
    "CgroupJobRef",
    "JobCgroup",
    "JobCgroupStats",
    "parse_cgroup_path",
    "parse_cpu_list",
    "read_kernel_file",
]

# Key of the single directory of a cgroup v2 job in JobCgroup.dirs.
UNIFIED = "unified"

_ID = r"[1-9][0-9]{0,9}"  # Slurm prints uint32 ids with %u: no sign, no leading zero
_V1_TOP_RE = re.compile(r"slurm(?:_.+)?")
_UID_RE = re.compile(r"uid_(0|[1-9][0-9]{0,9})")  # root's jobs run as uid_0
_JOB_RE = re.compile(rf"job_({_ID})")
# Canonical printed SLUID: "s" and 13 upper-case Crockford base32 digits (no I, L, O, U).
_SLUID_RE = re.compile(r"s[0-9A-HJKMNP-TV-Z]{13}")
_SCOPE_RE = re.compile(r"(?:.+_)?slurmstepd\.scope")
_NUM = r"(?:0|[1-9][0-9]{0,9})"
# step_<n>, step_<n>+<het component>, or one of Slurm's named steps.
_STEP_RE = re.compile(rf"step_({_NUM}(?:\+{_NUM})?|batch|extern|interactive)")

# v1 memory cgroups report "no limit" as PAGE_COUNTER_MAX pages (about 2**63 bytes,
# rounded down to the page size); anything this large is no real limit.
_V1_UNLIMITED = 1 << 60

# v1 trees to list a job's processes from, best first. Slurm 22.05 keeps slurmstepd
# in the job-level freezer cgroup and in the step-level memory/devices/cpuset
# cgroups; the tasks sit in the leaves below (freezer step_<s>, task_<n> elsewhere).
# freezer (proctrack/cgroup) holds every process of every step; cpuset, whose
# step cgroups are leaves shared with slurmstepd, is the last resort.
_V1_PID_SOURCES = ("freezer", "cpuacct", "memory", "devices", "cpuset")

_SLICE_DEPTH = 4  # how deep nested systemd slices (a.slice/a-b.slice/...) are searched

# Seconds after a job is first seen (or first expected) during which every call
# looks for Slurm roots that appeared late.
NEW_JOB_WINDOW_S = 10.0


class CgroupGone(Exception):
    """The job's cgroup vanished while it was being read: the job ended, a normal outcome."""


@dataclass(frozen=True)
class CgroupJobRef:
    """Where in a Slurm job a cgroup path points.

    ``job_key`` is the numeric job id, or the SLUID when the layout names job
    directories by SLUID (``is_sluid``). ``step`` is ``"0"``, ``"batch"``,
    ``"extern"``, ``"interactive"``, ``"0+1"``..., or None for the job level.
    ``uid`` comes from v1 paths (``uid_<uid>``); v2 paths do not carry it.
    """

    job_key: str
    step: str | None
    uid: int | None
    is_sluid: bool


def parse_cgroup_path(path: str) -> CgroupJobRef | None:
    """Map a cgroup path, as written in /proc/<pid>/cgroup, to the Slurm job it is in.

    Returns None for any cgroup outside a Slurm job (system services, the
    ``system`` leaves, user sessions) and for look-alikes such as ``job_12abc``,
    ``step_foo`` or paths with ``.``/``..`` components.
    """
    raw = path.split("/")
    if "." in raw or ".." in raw:
        return None
    parts = [p for p in raw if p]
    for i, name in enumerate(parts):
        if _SCOPE_RE.fullmatch(name):
            ref = _parse_v2_tail(parts[i + 1 :])
        elif _V1_TOP_RE.fullmatch(name):
            ref = _parse_v1_tail(parts[i + 1 :])
        else:
            continue
        if ref is not None:
            return ref
    return None


def _parse_step(parts: list[str]) -> tuple[bool, str | None]:
    """(valid, step name) for what follows a job directory; anything below a step is the step's."""
    if not parts:
        return True, None
    m = _STEP_RE.fullmatch(parts[0])
    if m is None:
        return False, None
    return True, m.group(1)


def _parse_v1_tail(parts: list[str]) -> CgroupJobRef | None:
    if len(parts) < 2:
        return None
    uid_m = _UID_RE.fullmatch(parts[0])
    job_m = _JOB_RE.fullmatch(parts[1])
    if uid_m is None or job_m is None:
        return None
    ok, step = _parse_step(parts[2:])
    if not ok:
        return None
    return CgroupJobRef(job_key=job_m.group(1), step=step, uid=int(uid_m.group(1)), is_sluid=False)


def _job_dir_key(name: str) -> tuple[str, bool] | None:
    """(job_key, is_sluid) for a v2 job directory name, None for anything else."""
    m = _JOB_RE.fullmatch(name)
    if m is not None:
        return m.group(1), False
    if _SLUID_RE.fullmatch(name):
        return name, True
    return None


def _parse_v2_tail(parts: list[str]) -> CgroupJobRef | None:
    if not parts:
        return None
    key = _job_dir_key(parts[0])
    if key is None:
        return None
    ok, step = _parse_step(parts[1:])
    if not ok:
        return None
    return CgroupJobRef(job_key=key[0], step=step, uid=None, is_sluid=key[1])


MAX_CPUS = 1 << 16


def parse_cpu_list(text: str) -> frozenset[int]:
    """Parse a kernel CPU list such as ``0-3,8,10-11``; raises ValueError when malformed."""
    cpus: set[int] = set()
    for item in text.strip().split(","):
        if not item:
            continue
        lo, sep, hi = item.partition("-")
        first = int(lo)
        last = int(hi) if sep else first
        # The kernel's limit is 8192 CPUs; a larger range is garbage, not a set to build.
        if first < 0 or last < first or last >= MAX_CPUS:
            raise ValueError(f"bad CPU range {item!r}")
        cpus.update(range(first, last + 1))
    return frozenset(cpus)


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


@dataclass
class _Partial:
    """Stats of one job directory set, before instances of a multi-slurmd job are summed."""

    cpu_seconds: float | None = None
    cpus: frozenset[int] | None = None
    memory_used: int | None = None
    memory_limit: int | None = None
    memory_peak: int | None = None
    oom_kills: int | None = None
    pids: frozenset[int] = frozenset()


# The helpers below run for every job on every sample: they take plain string
# paths, which costs a fraction of building pathlib objects.


def read_kernel_file(path: str | os.PathLike[str]) -> bytes:
    """All of a small cgroupfs or procfs file, through one descriptor; raises OSError.

    Read in a loop: such files report size 0, so a single sized read cannot be used.
    """
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks)


def _read_text(path: str) -> str | None:
    """One cgroup file's content, or None when it is missing or unreadable.

    Any OSError counts: a file of a cgroup being removed can fail with ENOENT,
    ENODEV or EINVAL, and one odd file must not fail the whole job.
    """
    try:
        return read_kernel_file(path).decode("ascii", "replace")
    except OSError:
        return None


def _read_int(path: str) -> int | None:
    text = _read_text(path)
    if text is None:
        return None
    try:
        return int(text.strip())
    except ValueError:
        return None


def _read_keyed(path: str, key: str) -> int | None:
    """Value of ``key`` in a flat-keyed file such as memory.stat or cpu.stat."""
    text = _read_text(path)
    if text is None:
        return None
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name == key:
            try:
                return int(value.strip())
            except ValueError:
                return None
    return None


def _read_cpus(path: str) -> frozenset[int] | None:
    text = _read_text(path)
    if text is None:
        return None
    try:
        cpus = parse_cpu_list(text)
    except ValueError:
        return None
    # An empty cpuset means "not configured yet", not "zero CPUs".
    return cpus or None


def _read_procs(directory: str) -> list[int] | None:
    """Pids in one cgroup; None when the cgroup is gone."""
    text = _read_text(directory + "/cgroup.procs")
    if text is None:
        return None
    pids = []
    for line in text.split():
        try:
            pids.append(int(line))
        except ValueError:
            continue
    return pids


def _subdirs(directory: str | Path) -> list[os.DirEntry[str]]:
    """Child directories, not following symlinks; empty when the directory is gone."""
    try:
        with os.scandir(directory) as it:
            return [e for e in it if e.is_dir(follow_symlinks=False)]
    except (FileNotFoundError, NotADirectoryError):
        return []


def _child_cgroups(directory: str) -> list[str]:
    """Names of the child cgroups Slurm made in a job's subtree.

    Every interface file of a cgroup directory has a dot in its name (or is v1's
    ``tasks``/``notify_on_release``); Slurm's own directories have none.
    """
    try:
        with os.scandir(directory) as it:
            return [e.name for e in it if "." not in e.name and e.is_dir(follow_symlinks=False)]
    except (FileNotFoundError, NotADirectoryError):
        return []


def _step_leaves(job_dir: str, skip_stepd_leaf: bool) -> list[str]:
    """The leaf cgroups of the job's steps: where Slurm puts the job's processes.

    Slurm keeps slurmstepd above the leaves (job-level freezer cgroup, step-level
    memory/devices cgroups on v1) or in the v2 leaf ``step_<s>/slurm``, skipped here.
    """
    leaves = []
    steps = [f"{job_dir}/{step}" for step in _child_cgroups(job_dir) if _STEP_RE.fullmatch(step)]
    stack = [(step, True) for step in steps]
    while stack:
        d, is_step = stack.pop()
        children = _child_cgroups(d)
        if not children:
            leaves.append(d)
        for child in children:
            if not (skip_stepd_leaf and is_step and child == "slurm"):
                stack.append((f"{d}/{child}", False))
    return leaves


def _pids_of(leaves: Iterable[str]) -> frozenset[int] | None:
    """Pids of all the leaves; None as soon as one is gone (the list is stale)."""
    pids: set[int] = set()
    for leaf in leaves:
        got = _read_procs(leaf)
        if got is None:
            return None
        pids.update(got)
    return frozenset(pids)


def _sum_int(values: Iterable[int | None]) -> int | None:
    present = [v for v in values if v is not None]
    return sum(present) if present else None


def _sum_float(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return sum(present) if present else None


def _slurm_tops(hierarchy: str) -> list[str]:
    """The ``slurm*`` roots directly under one v1 hierarchy."""
    return [e.path for e in _subdirs(hierarchy) if _V1_TOP_RE.fullmatch(e.name)]


class CgroupFS:
    """Reads Slurm's job cgroups under a cgroup mount (``--cgroup-root``).

    Not thread-safe: one sampler thread owns an instance.
    """

    def __init__(
        self,
        root: Path = Path("/sys/fs/cgroup"),
        *,
        rescan_interval: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``rescan_interval``: seconds between searches for Slurm's tree roots."""
        self.root = Path(root)
        self._rescan_interval = rescan_interval
        self._clock = clock
        self._roots: list[tuple[frozenset[str], str]] = []  # (controllers, Slurm tree root)
        self._roots_version = 0
        self._roots_scanned_at: float | None = None
        # v1 hierarchies (real path -> controllers) without a Slurm root at the last scan.
        self._bare: dict[str, frozenset[str]] = {}
        # job key -> when it was first seen or expected, while it is new.
        self._new_since: dict[str, float] = {}
        # job key -> (what it was found as, the JobCgroup handed out for it).
        self._jobs: dict[str, tuple[object, JobCgroup]] = {}
        # v2 job dir -> (nr_descendants, leaf cgroups) when last walked.
        self._leaves: dict[str, tuple[int, tuple[str, ...]]] = {}

    def version(self) -> int:
        """2 on a pure cgroup v2 mount, else 1.

        A hybrid mount (v1 controllers plus a ``unified`` cgroup2 tree) counts as v1:
        Slurm's cgroup/v1 plugin drives the v1 controllers there and the unified
        tree carries no controllers.
        """
        return 2 if (self.root / "cgroup.controllers").exists() else 1

    def slurm_roots(self) -> tuple[Path, ...]:
        """Slurm's tree roots on this node: v1 ``slurm*`` dirs per hierarchy, v2 stepd scopes.

        Empty where Slurm does not use cgroups (or no slurmd has started yet).
        """
        return tuple(Path(path) for _, path in self._current_roots(self._clock()))

    def find_jobs(self, expected: Iterable[str] = ()) -> dict[str, JobCgroup]:
        """Every job with a cgroup on this node, keyed by job key (job id or SLUID).

        ``expected``: keys of jobs the caller knows to run here (spool records) that
        had no cgroup yet; while one is new, a late Slurm root is looked for.
        """
        now = self._clock()
        roots = self._current_roots(now)
        found, stale = self._list_jobs(roots)
        new_jobs = self._track_new(now, found, expected)
        if new_jobs and not stale and self._rescan_late_roots():
            found, stale = self._list_jobs(self._roots)
        if stale:
            self._roots_scanned_at = None  # look for the roots again next time
        return self._job_cgroups(found)

    def _track_new(self, now: float, found: Mapping[str, object], expected: Iterable[str]) -> bool:
        """Note first sightings; True while some job is new enough to look for late roots."""
        wanted = set(found)
        wanted.update(expected)
        for key in wanted:
            self._new_since.setdefault(key, now)
        self._new_since = {k: t for k, t in self._new_since.items() if k in wanted}
        return any(now - t < NEW_JOB_WINDOW_S for t in self._new_since.values())

    def _rescan_late_roots(self) -> bool:
        """Look for roots made after the last scan; True when the roots changed."""
        if self._roots_version == 2:
            roots = [(frozenset({UNIFIED}), p) for p in self._scan_v2_roots()]
        elif self._bare:
            roots = list(self._roots)
            for real, names in self._bare.items():
                roots.extend((names, p) for p in _slurm_tops(real))
        else:
            return False
        if roots == self._roots:
            return False
        self._set_roots(roots)
        return True

    def _list_jobs(
        self, roots: list[tuple[frozenset[str], str]]
    ) -> tuple[dict[str, tuple[int | None, bool, dict[str, dict[str, str]]]], bool]:
        """(job key -> (uid, is_sluid, instance -> controller -> dir), a root vanished)."""
        version = self._roots_version
        # A job has one set of directories per slurmd instance: per v1 "slurm*" name
        # (shared by all controllers) or per v2 scope.
        found: dict[str, tuple[int | None, bool, dict[str, dict[str, str]]]] = {}
        stale = False
        for controllers, top in roots:
            if not os.path.isdir(top):
                stale = True
                continue
            instance = top if version == 2 else os.path.basename(top)
            for job_key, uid, is_sluid, job_dir in self._jobs_under(top, version):
                _, _, instances = found.setdefault(job_key, (uid, is_sluid, {}))
                dirs = instances.setdefault(instance, {})
                for ctrl in controllers:
                    dirs[ctrl] = job_dir
        return found, stale

    def _job_cgroups(
        self, found: dict[str, tuple[int | None, bool, dict[str, dict[str, str]]]]
    ) -> dict[str, JobCgroup]:
        version = self._roots_version
        jobs: dict[str, JobCgroup] = {}
        for job_key, (uid, is_sluid, instances) in found.items():
            ordered = tuple(tuple(sorted(instances[name].items())) for name in sorted(instances))
            signature = (uid, is_sluid, version, ordered)
            known = self._jobs.get(job_key)
            # Unchanged jobs keep their JobCgroup: no new objects on every sample.
            if known is not None and known[0] == signature:
                jobs[job_key] = known[1]
                continue
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
        self._leaves = {d: v for d, v in self._leaves.items() if d in live}
        return jobs

    def read_stats(self, job: JobCgroup) -> JobCgroupStats:
        """Read one job's accounting; raises CgroupGone when its directory vanished.

        A single missing or odd file leaves its field None instead of failing the job.
        """
        instances = [job.dirs, *job.more_dirs]
        if not any(os.path.isdir(p) for dirs in instances for p in dirs.values()):
            raise CgroupGone(f"cgroup of job {job.job_key} is gone")
        reader = self._read_v2 if job.version == 2 else self._read_v1
        parts = [reader(dirs) for dirs in instances]
        # Files of an ending job vanish one by one: partial values are not worth reporting.
        if not any(os.path.isdir(p) for dirs in instances for p in dirs.values()):
            raise CgroupGone(f"cgroup of job {job.job_key} vanished while being read")
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

    # --- roots -------------------------------------------------------------

    def _current_roots(self, now: float) -> list[tuple[frozenset[str], str]]:
        if (
            not self._roots
            or self._roots_scanned_at is None
            or now - self._roots_scanned_at >= self._rescan_interval
        ):
            self._roots_version = self.version()
            if self._roots_version == 2:
                self._bare = {}
                self._set_roots([(frozenset({UNIFIED}), p) for p in self._scan_v2_roots()])
            else:
                self._set_roots(self._scan_v1_roots())
            self._roots_scanned_at = now
        return self._roots

    def _set_roots(self, roots: list[tuple[frozenset[str], str]]) -> None:
        self._roots = sorted(roots, key=lambda root: root[1])
        if self._roots_version == 1:
            rooted = {os.path.dirname(path) for _, path in self._roots}
            self._bare = {real: names for real, names in self._bare.items() if real not in rooted}

    def _scan_v1_roots(self) -> list[tuple[frozenset[str], str]]:
        # Group mount points by their real directory: "cpu" and "cpuacct" are often
        # symlinks to one "cpu,cpuacct" hierarchy, which must be read once.
        hierarchies: dict[str, set[str]] = {}
        try:
            with os.scandir(self.root) as it:
                entries = [e for e in it if e.is_dir()]
        except (FileNotFoundError, NotADirectoryError):
            self._bare = {}
            return []
        for entry in entries:
            real = os.path.realpath(entry.path)
            names = hierarchies.setdefault(real, set())
            names.update(n for n in entry.name.split(",") if n)
            names.update(n for n in os.path.basename(real).split(",") if n)
        roots = []
        self._bare = {}
        for real, names in sorted(hierarchies.items()):
            tops = _slurm_tops(real)
            if not tops:
                self._bare[real] = frozenset(names)
            roots.extend((frozenset(names), top) for top in tops)
        return roots

    def _scan_v2_roots(self) -> list[str]:
        roots = []
        stack = [(os.fspath(self.root), 0)]
        while stack:
            directory, depth = stack.pop()
            for entry in _subdirs(directory):
                if _SCOPE_RE.fullmatch(entry.name):
                    roots.append(entry.path)
                elif entry.name.endswith(".slice") and depth < _SLICE_DEPTH:
                    stack.append((entry.path, depth + 1))
        return sorted(roots)

    @staticmethod
    def _jobs_under(top: str, version: int) -> Iterable[tuple[str, int | None, bool, str]]:
        if version == 2:
            for entry in _subdirs(top):
                key = _job_dir_key(entry.name)
                if key is not None:
                    yield key[0], None, key[1], entry.path
            return
        for uid_entry in _subdirs(top):
            uid_m = _UID_RE.fullmatch(uid_entry.name)
            if uid_m is None:
                continue
            for job_entry in _subdirs(uid_entry.path):
                job_m = _JOB_RE.fullmatch(job_entry.name)
                if job_m is not None:
                    yield job_m.group(1), int(uid_m.group(1)), False, job_entry.path

    # --- stats -------------------------------------------------------------

    @staticmethod
    def _read_v1(dirs: Mapping[str, Path]) -> _Partial:
        out = _Partial()
        if "cpuacct" in dirs:
            usage_ns = _read_int(f"{dirs['cpuacct']}/cpuacct.usage")
            out.cpu_seconds = usage_ns / 1e9 if usage_ns is not None else None
        if "cpuset" in dirs:
            cpuset = os.fspath(dirs["cpuset"])
            out.cpus = _read_cpus(f"{cpuset}/cpuset.effective_cpus") or _read_cpus(
                f"{cpuset}/cpuset.cpus"
            )
        if "memory" in dirs:
            memory = os.fspath(dirs["memory"])
            usage = _read_int(f"{memory}/memory.usage_in_bytes")
            # total_* counts the whole subtree: the job's pages sit in its task cgroups.
            inactive = _read_keyed(f"{memory}/memory.stat", "total_inactive_file")
            if usage is not None:
                out.memory_used = max(0, usage - (inactive or 0))
            limit = _read_int(f"{memory}/memory.limit_in_bytes")
            out.memory_limit = limit if limit is not None and limit < _V1_UNLIMITED else None
            out.memory_peak = _read_int(f"{memory}/memory.max_usage_in_bytes")
            out.oom_kills = _read_keyed(f"{memory}/memory.oom_control", "oom_kill")
        for ctrl in _V1_PID_SOURCES:
            if ctrl in dirs and os.path.isdir(dirs[ctrl]):
                out.pids = _pids_of(_step_leaves(os.fspath(dirs[ctrl]), False)) or frozenset()
                break
        return out

    def _v2_pids(self, job_dir: str) -> frozenset[int]:
        # Listing every directory of a job's subtree costs more than reading it:
        # the leaves are remembered while cgroup.stat's nr_descendants is unchanged
        # (a leaf that vanished in between also forces a fresh walk).
        count = _read_keyed(f"{job_dir}/cgroup.stat", "nr_descendants")
        cached = self._leaves.get(job_dir)
        if count is not None and cached is not None and cached[0] == count:
            pids = _pids_of(cached[1])
            if pids is not None:
                return pids
        leaves = tuple(_step_leaves(job_dir, True))
        if count is not None:
            self._leaves[job_dir] = (count, leaves)
        return _pids_of(leaves) or frozenset()

    def _read_v2(self, dirs: Mapping[str, Path]) -> _Partial:
        out = _Partial()
        if UNIFIED not in dirs:
            return out
        job_dir = os.fspath(dirs[UNIFIED])
        usage_usec = _read_keyed(f"{job_dir}/cpu.stat", "usage_usec")
        out.cpu_seconds = usage_usec / 1e6 if usage_usec is not None else None
        out.cpus = _read_cpus(f"{job_dir}/cpuset.cpus.effective")
        current = _read_int(f"{job_dir}/memory.current")
        inactive = _read_keyed(f"{job_dir}/memory.stat", "inactive_file")
        if current is not None:
            out.memory_used = max(0, current - (inactive or 0))
        limit_text = _read_text(f"{job_dir}/memory.max")
        if limit_text is not None and limit_text.strip() != "max":
            try:
                out.memory_limit = int(limit_text.strip())
            except ValueError:
                out.memory_limit = None
        out.memory_peak = _read_int(f"{job_dir}/memory.peak")
        out.oom_kills = _read_keyed(f"{job_dir}/memory.events", "oom_kill")
        out.pids = self._v2_pids(job_dir)
        return out
