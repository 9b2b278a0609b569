"""Small readers of /proc/<pid>/* and the pid -> Slurm job mapping built on them.

Every reader takes the proc root (``--proc-root``) and reads one file. A process
that exits between listing and reading is a normal outcome: the readers raise
ProcessGone for it, and the classes here turn it into "no answer".

Standard library only (model/ids.py, kernelfile.py and cgroup/paths.py, its imports,
are stdlib too).
"""

from __future__ import annotations

import errno
import functools
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from slurm_gpu_exporter.model.ids import is_slurm_id, is_slurm_num
from slurm_gpu_exporter.node.cgroup.paths import SlurmRoot, job_under_roots
from slurm_gpu_exporter.node.kernelfile import read_kernel_file

__all__ = [
    "PidJob",
    "PidJobMapper",
    "ProcStat",
    "ProcessCpuAccumulator",
    "ProcessGone",
    "clock_ticks",
    "read_cgroup_lines",
    "read_cgroup_paths",
    "read_environ_values",
    "read_stat",
    "read_uid",
]



class ProcessGone(Exception):
    """The process exited (or its pid is not there): a normal outcome, not an error."""

    def __init__(self, pid: int) -> None:
        super().__init__(f"process {pid} is gone")
        self.pid = pid


def _read_proc_file(proc_root: str | Path, pid: int, name: str) -> bytes:
    """Whole content of /proc/<pid>/<name>; ProcessGone when the process is not there.

    PermissionError passes through: only the process's owner or root may read some
    files (environ), and that is a configuration problem, not an exit.
    """
    try:
        # A plain string path: this runs for every GPU process on every sample.
        return read_kernel_file(f"{proc_root}/{pid}/{name}")
    except OSError as e:
        # ENOENT/ENOTDIR: no such process; ESRCH: it exited after the open.
        if e.errno in (errno.ENOENT, errno.ENOTDIR, errno.ESRCH):
            raise ProcessGone(pid) from None
        raise


@dataclass(frozen=True)
class ProcStat:
    """The fields of /proc/<pid>/stat this project uses (times in clock ticks)."""

    pid: int
    start_ticks: int
    utime_ticks: int
    stime_ticks: int
    ppid: int
    comm: str


def read_stat(proc_root: str | Path, pid: int) -> ProcStat:
    """Parse /proc/<pid>/stat; raises ProcessGone, or ValueError for a malformed file.

    The command name may hold spaces and ')' itself, so it is taken up to the last ')'.
    """
    text = _read_proc_file(proc_root, pid, "stat").decode("utf-8", "replace")
    open_paren = text.find("(")
    close_paren = text.rfind(")")
    if open_paren < 0 or close_paren < open_paren:
        raise ValueError(f"malformed stat of pid {pid}")
    rest = text[close_paren + 1 :].split()
    # rest[0] is field 3 (state) of proc(5): utime is field 14, stime 15, starttime 22.
    if len(rest) < 20:
        raise ValueError(f"short stat of pid {pid}")
    return ProcStat(
        pid=pid,
        start_ticks=int(rest[19]),
        utime_ticks=int(rest[11]),
        stime_ticks=int(rest[12]),
        ppid=int(rest[1]),
        comm=text[open_paren + 1 : close_paren],
    )


def read_cgroup_lines(proc_root: Path | str, pid: int) -> list[tuple[str, str]]:
    """(controller list, path) of each line of /proc/<pid>/cgroup: one per v1 hierarchy
    (``name=systemd`` for a named one) and ``("", path)`` for the v2 tree."""
    text = _read_proc_file(proc_root, pid, "cgroup").decode("utf-8", "replace")
    lines = []
    for line in text.splitlines():
        # "hierarchy-id:controller-list:path"; the path itself may contain ':'.
        parts = line.split(":", 2)
        if len(parts) == 3 and parts[2]:
            lines.append((parts[1], parts[2]))
    return lines


def read_cgroup_paths(proc_root: Path, pid: int) -> list[str]:
    """The cgroup paths of /proc/<pid>/cgroup, one per hierarchy (v1 lines and the v2 line)."""
    return [path for _, path in read_cgroup_lines(proc_root, pid)]


def read_environ_values(proc_root: Path, pid: int, names: Iterable[str]) -> dict[str, str]:
    """The variables among ``names`` present in the environment the process started with.

    One read of /proc/<pid>/environ for all of them. Raises ProcessGone, or
    PermissionError where the caller may not read it.
    """
    wanted = {name.encode() for name in names}
    found: dict[str, str] = {}
    for entry in _read_proc_file(proc_root, pid, "environ").split(b"\0"):
        key, sep, value = entry.partition(b"=")
        if sep and key in wanted:
            found[key.decode()] = value.decode("utf-8", "replace")
    return found


def read_uid(proc_root: Path, pid: int) -> int:
    """Real uid of the process, from /proc/<pid>/status."""
    for line in _read_proc_file(proc_root, pid, "status").splitlines():
        if line.startswith(b"Uid:"):
            return int(line.split()[1])
    raise ValueError(f"no Uid line in status of pid {pid}")


@functools.cache
def clock_ticks() -> int:
    """Clock ticks per second of the times in /proc/<pid>/stat (USER_HZ)."""
    return os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class PidJob:
    """The Slurm job of a process; ``source`` says how it was found: "cgroup" or "environ"."""

    job_key: str
    step: str | None
    is_sluid: bool
    source: str


class _CacheEntry:
    __slots__ = ("asked_at", "job", "resolved_at", "start_ticks")

    def __init__(self, start_ticks: int, job: PidJob | None, now: float) -> None:
        self.start_ticks = start_ticks
        self.job = job
        self.resolved_at = now
        self.asked_at = now


class PidJobMapper:
    """Maps a pid to its Slurm job through /proc/<pid>/cgroup.

    Only a path below one of ``slurm_roots`` (what ``CgroupFS.proc_roots()`` found,
    per hierarchy) names a job; the owner of the mapper sets them from the sampler
    thread, and until then no cgroup path names a job.

    Where the node has no Slurm cgroups (proctrack/linuxproc, cgroups disabled) it
    falls back to ``SLURM_JOB_ID`` in /proc/<pid>/environ. The environment is the
    user's to set, so the fallback is off as soon as Slurm's roots are known (a forged
    variable must not move usage to another job), and never on for a mapper made with
    ``environ_fallback=False``.

    Answers are cached by (pid, start time), so a reused pid is resolved afresh.
    "Not in a job" is re-checked after ``negative_ttl`` seconds, since
    pam_slurm_adopt can move a process into a job later. Entries not asked for in
    ``idle_seconds`` are dropped, and the cache never holds more than
    ``max_entries``. Not thread-safe: one sampler thread owns it.
    """

    def __init__(
        self,
        proc_root: Path,
        *,
        environ_fallback: bool = True,
        max_entries: int = 65536,
        idle_seconds: float = 600.0,
        negative_ttl: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """See the class docstring for what each option bounds."""
        self.proc_root = Path(proc_root)
        self._proc = os.fspath(self.proc_root)  # for the per-sample reads
        self._environ_fallback = environ_fallback
        self._max_entries = max_entries
        self._idle_seconds = idle_seconds
        self._negative_ttl = negative_ttl
        self._clock = clock
        self._cache: dict[int, _CacheEntry] = {}
        self._pruned_at = clock()
        self._roots: tuple[SlurmRoot, ...] = ()

    @property
    def slurm_roots(self) -> tuple[SlurmRoot, ...]:
        """Where Slurm's job cgroups are: the only paths that name a job."""
        return self._roots

    @slurm_roots.setter
    def slurm_roots(self, roots: tuple[SlurmRoot, ...]) -> None:
        roots = tuple(roots)
        if roots != self._roots:
            # Answers given under other roots (a root that appeared late, or went)
            # are worth nothing now.
            self._roots = roots
            self._cache = {}

    @property
    def environ_fallback(self) -> bool:
        """Whether a process outside every Slurm cgroup is mapped by its environment:
        only on a node without Slurm cgroups. Answers taken from the environment do not
        outlive the appearance of Slurm's roots: new roots drop every answer."""
        return self._environ_fallback and not self._roots

    def __len__(self) -> int:
        """Number of cached pids."""
        return len(self._cache)

    def job_of(self, pid: int) -> PidJob | None:
        """The job of ``pid``, or None when it is in no job or has exited."""
        now = self._clock()
        try:
            start = read_stat(self._proc, pid).start_ticks
        except (ProcessGone, ValueError, OSError):
            self._cache.pop(pid, None)
            return None
        entry = self._cache.get(pid)
        fresh = entry is not None and (
            entry.job is not None or now - entry.resolved_at < self._negative_ttl
        )
        if entry is not None and fresh and entry.start_ticks == start:
            entry.asked_at = now
            return entry.job
        roots = self._roots
        try:
            job = self._resolve(pid, roots)
            # The pid may have been reused while its files were read: check it still
            # names the same process before caching the answer.
            if read_stat(self.proc_root, pid).start_ticks != start:
                self._cache.pop(pid, None)
                return None
        except (ProcessGone, ValueError, OSError):
            self._cache.pop(pid, None)
            return None
        if roots is self._roots:  # else the roots changed meanwhile (another thread)
            self._cache[pid] = _CacheEntry(start, job, now)
            self._prune(now)
        return job

    def _resolve(self, pid: int, roots: tuple[SlurmRoot, ...]) -> PidJob | None:
        for controllers, path in read_cgroup_lines(self._proc, pid):
            ref = job_under_roots(controllers, path, roots)
            if ref is not None:
                return PidJob(ref.job_key, ref.step, ref.is_sluid, "cgroup")
        if not self.environ_fallback:
            return None
        env = read_environ_values(self.proc_root, pid, ("SLURM_JOB_ID", "SLURM_STEP_ID"))
        job_id = env.get("SLURM_JOB_ID")
        if job_id is None or not is_slurm_id(job_id):
            return None
        # Tasks of srun steps carry SLURM_STEP_ID; a batch script does not.
        step = env.get("SLURM_STEP_ID")
        if step is not None and not is_slurm_num(step):
            step = None
        return PidJob(job_id, step, False, "environ")

    def _prune(self, now: float) -> None:
        if len(self._cache) <= self._max_entries and now - self._pruned_at < self._idle_seconds:
            return
        self._pruned_at = now
        horizon = now - self._idle_seconds
        self._cache = {pid: e for pid, e in self._cache.items() if e.asked_at >= horizon}
        if len(self._cache) > self._max_entries:
            keep = sorted(self._cache.items(), key=lambda item: item[1].asked_at)
            self._cache = dict(keep[len(keep) - self._max_entries :])


@dataclass
class _JobCpu:
    live: dict[int, tuple[int, int]] = field(default_factory=dict)  # pid -> (start, ticks)
    # Processes no longer listed, kept a few updates in case they come back (a pid
    # list read mid-migration can miss one): pid -> (start, ticks, update number).
    gone: dict[int, tuple[int, int, int]] = field(default_factory=dict)
    retired_ticks: int = 0
    updates: int = 0
    last_seconds: float = 0.0


class ProcessCpuAccumulator:
    """A job's CPU seconds summed from its processes, for nodes without cpuacct job cgroups.

    The total is monotonic: a process that exits keeps counting with the last value
    seen for it, and a reused pid (new start time) starts a new process. The
    approximation: CPU a process used between the last sample and its exit is lost,
    and so is a process born and gone between two samples (their time goes to the
    parent's cutime only once reaped, which is not counted to avoid counting twice).
    """

    # How many updates a vanished pid is remembered, so that it is not counted
    # twice if a later pid list shows it again.
    _GONE_UPDATES = 3

    def __init__(self, proc_root: Path, ticks_per_second: int | None = None) -> None:
        """``ticks_per_second`` defaults to the system's USER_HZ."""
        self.proc_root = Path(proc_root)
        self._hz = ticks_per_second or clock_ticks()
        self._jobs: dict[str, _JobCpu] = {}

    def update(self, job_key: str, pids: Iterable[int]) -> float:
        """Take in the job's current processes; return its CPU seconds so far."""
        state = self._jobs.setdefault(job_key, _JobCpu())
        state.updates += 1
        seen: dict[int, tuple[int, int]] = {}
        for pid in set(pids):
            try:
                st = read_stat(self.proc_root, pid)
            except (ProcessGone, ValueError, OSError):
                continue
            ticks = st.utime_ticks + st.stime_ticks
            prev = state.live.get(pid)
            if prev is None and pid in state.gone:
                start, gone_ticks, _ = state.gone.pop(pid)
                if start == st.start_ticks:
                    # Back after a missed listing: move it from retired to live again.
                    state.retired_ticks -= gone_ticks
                    prev = (start, gone_ticks)
            if prev is not None and prev[0] == st.start_ticks:
                ticks = max(ticks, prev[1])
            elif prev is not None:
                state.retired_ticks += prev[1]  # pid reused: the old process ended
            seen[pid] = (st.start_ticks, ticks)
        for pid, (start, ticks) in state.live.items():
            if pid not in seen:
                state.retired_ticks += ticks
                state.gone[pid] = (start, ticks, state.updates)
        oldest = state.updates - self._GONE_UPDATES
        state.gone = {p: g for p, g in state.gone.items() if g[2] > oldest and p not in seen}
        state.live = seen
        total = (state.retired_ticks + sum(t for _, t in seen.values())) / self._hz
        state.last_seconds = max(total, state.last_seconds)
        return state.last_seconds

    def forget(self, job_key: str) -> None:
        """Drop a finished job's state."""
        self._jobs.pop(job_key, None)

    def export_job(self, job_key: str) -> dict[str, object] | None:
        """What a restart needs to carry on counting a job exactly (JSON-ready)."""
        state = self._jobs.get(job_key)
        if state is None:
            return None
        return {
            "retired_ticks": state.retired_ticks,
            "live": {str(pid): [start, ticks] for pid, (start, ticks) in state.live.items()},
            "seconds": state.last_seconds,
        }

    def import_job(self, job_key: str, data: object) -> None:
        """Restore a job saved by export_job: a process still running with the same start
        time continues from its saved ticks; one gone since is retired with them."""
        if not isinstance(data, dict):
            return
        try:
            live = {int(pid): (int(v[0]), int(v[1])) for pid, v in data["live"].items()}
            self._jobs[job_key] = _JobCpu(live=live, retired_ticks=int(data["retired_ticks"]),
                                          last_seconds=float(data["seconds"]))
        except (KeyError, TypeError, ValueError, IndexError, AttributeError):
            return
