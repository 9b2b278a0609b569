"""Small readers of cgroup files and directories, shared by the v1 and v2 readers.

Each returns None (or nothing) for a file that is missing or odd: files of a cgroup
being removed vanish one by one, and one odd file must not fail the whole job.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from slurm_gpu_exporter.node.cgroup.paths import STEP_RE
from slurm_gpu_exporter.node.kernelfile import read_kernel_file

# Key of the single directory of a cgroup v2 job in JobCgroup.dirs.
UNIFIED = "unified"


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


@dataclass
class PartialStats:
    """Stats of one job directory set, before instances of a multi-slurmd job are summed."""

    cpu_seconds: float | None = None
    cpus: frozenset[int] | None = None
    memory_used: int | None = None
    memory_limit: int | None = None
    memory_peak: int | None = None
    oom_kills: int | None = None
    pids: frozenset[int] = frozenset()
    # A file that is always there could not be read: the cgroup may be going.
    missing: bool = False


# The helpers below run for every job on every sample: they take plain string
# paths, which costs a fraction of building pathlib objects.


# How a file is read: read_kernel_file, or HeldFiles.read (the sampler's cgroup reads).
Reader = Callable[[str], bytes]


def read_cgroup_file(path: str, read: Reader = read_kernel_file) -> bytes | None:
    """One cgroup file's bytes, or None when it is missing or unreadable.

    Any OSError counts: a file of a cgroup being removed can fail with ENOENT,
    ENODEV or EINVAL, and one odd file must not fail the whole job.
    """
    try:
        return read(path)
    except OSError:
        return None


def read_text(path: str) -> str | None:
    """One cgroup file's content, or None when it is missing or unreadable."""
    data = read_cgroup_file(path)
    return None if data is None else data.decode("ascii", "replace")


def read_int(path: str, read: Reader = read_kernel_file) -> int | None:
    data = read_cgroup_file(path, read)
    if data is None:
        return None
    try:
        return int(data)  # int() takes bytes and ignores the surrounding whitespace
    except ValueError:
        return None


def read_keyed(path: str, key: str, read: Reader = read_kernel_file) -> int | None:
    """Value of ``key`` in a flat-keyed file such as memory.stat or cpu.stat.

    Only the wanted line is looked at: memory.stat has some 40 lines, one is needed."""
    data = read_cgroup_file(path, read)
    if data is None:
        return None
    wanted = key.encode() + b" "
    if data.startswith(wanted):
        start = len(wanted)
    else:
        at = data.find(b"\n" + wanted)
        if at < 0:
            return None
        start = at + 1 + len(wanted)
    end = data.find(b"\n", start)
    try:
        return int(data[start:] if end < 0 else data[start:end])
    except ValueError:
        return None


def read_cpus(path: str) -> frozenset[int] | None:
    text = read_text(path)
    if text is None:
        return None
    try:
        cpus = parse_cpu_list(text)
    except ValueError:
        return None
    # An empty cpuset means "not configured yet", not "zero CPUs".
    return cpus or None


# What a limit file's reader gives for "no limit": a value SteadyFiles keeps, as it
# keeps a number (None, "could not read", is read again at the next sample).
NO_LIMIT = -1


def limit_or_none(value: object) -> int | None:
    """A steady limit as the stats give it: None for NO_LIMIT (and for no value)."""
    return None if value is None or value == NO_LIMIT else value  # type: ignore[return-value]


class SteadyFiles:
    """Values of files that hardly ever change while a job runs (its cpuset, its memory
    limit), read again every ``ttl`` seconds instead of on every sample.

    A missing or odd value (None) is not kept: it is read again next time. Not
    thread-safe: the sampler thread owns it (through CgroupFS).
    """

    def __init__(self, ttl: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        self._ttl = ttl
        self._clock = clock
        self._values: dict[str, tuple[float, object]] = {}

    def get(self, path: str, read: Callable[[str], object]) -> object:
        now = self._clock()
        hit = self._values.get(path)
        if hit is not None and now - hit[0] < self._ttl:
            return hit[1]
        value = read(path)
        if value is None:
            self._values.pop(path, None)
        else:
            self._values[path] = (now, value)
        return value

    def keep_only(self, live_dirs: set[str]) -> None:
        """Forget the files of job directories not in ``live_dirs``."""
        self._values = {p: v for p, v in self._values.items()
                        if os.path.dirname(p) in live_dirs}


def read_procs(directory: str, read: Reader = read_kernel_file) -> list[int] | None:
    """Pids in one cgroup; None when the cgroup is gone.

    ``read``: HeldFiles.read holds ``cgroup.procs`` open only under its own rule (v1
    keeps the pid list of an open one while it is read again within a second)."""
    data = read_cgroup_file(directory + "/cgroup.procs", read)
    if data is None:
        return None
    try:
        return [int(line) for line in data.split()]
    except ValueError:  # never seen from the kernel; parse what can be parsed
        pids = []
        for line in data.split():
            try:
                pids.append(int(line))
            except ValueError:
                continue
        return pids


def subdirs(directory: str | Path) -> list[os.DirEntry[str]]:
    """Child directories, not following symlinks; empty when the directory is gone."""
    try:
        with os.scandir(directory) as it:
            return [e for e in it if e.is_dir(follow_symlinks=False)]
    except (FileNotFoundError, NotADirectoryError):
        return []


def child_cgroups(directory: str) -> list[str]:
    """Names of the child cgroups Slurm made in a job's subtree.

    Every interface file of a cgroup directory has a dot in its name (or is v1's
    ``tasks``/``notify_on_release``); Slurm's own directories have none.
    """
    try:
        with os.scandir(directory) as it:
            return [e.name for e in it if "." not in e.name and e.is_dir(follow_symlinks=False)]
    except (FileNotFoundError, NotADirectoryError):
        return []


def names(directory: str) -> list[str]:
    """Entry names of a directory (no DirEntry objects: this runs per job per sample)."""
    try:
        return os.listdir(directory)
    except (FileNotFoundError, NotADirectoryError):
        return []


def step_leaves(job_dir: str, skip_stepd_leaf: bool) -> list[str]:
    """The leaf cgroups of the job's steps: where Slurm puts the job's processes.

    Slurm keeps slurmstepd above the leaves (job-level freezer cgroup, step-level
    memory/devices cgroups on v1) or in the v2 leaf ``step_<s>/slurm``, skipped here.
    """
    leaves = []
    for step in child_cgroups(job_dir):
        if STEP_RE.fullmatch(step):
            leaves.extend(leaves_of_step(f"{job_dir}/{step}", skip_stepd_leaf))
    return leaves


def leaves_of_step(step_dir: str, skip_stepd_leaf: bool) -> list[str]:
    """The leaf cgroups below one step directory (the step itself when it has none)."""
    leaves = []
    stack = [(step_dir, True)]
    while stack:
        d, is_step = stack.pop()
        children = child_cgroups(d)
        if not children:
            leaves.append(d)
        for child in children:
            if not (skip_stepd_leaf and is_step and child == "slurm"):
                stack.append((f"{d}/{child}", False))
    return leaves


# v1 interface files whose names have no dot (every other interface file's has one).
_V1_DOTLESS_FILES = frozenset({"tasks", "notify_on_release"})


class StepLeaves:
    """A job's processes through its steps' leaf cgroups, the leaves remembered between
    samples (cgroup v1, which has no cgroup.stat to say that a subtree changed).

    A job's steps are listed when its directory's link count changed: on cgroupfs (as on
    most filesystems) a directory has 2 links plus one per subdirectory, so a ``stat``
    tells that a step came or went. A step that went while another came leaves the
    count as it was, but a remembered leaf of the gone step fails its read, and the job
    is listed again in the same sample. Where the count does not match the listing
    (a filesystem that does not count subdirectories), the steps are listed every time.
    A step's subtree is walked again while the step is young (its task cgroups appear a
    moment after it), when one of its remembered leaves is gone, and at least every
    ``rewalk`` seconds. Not thread-safe: the sampler thread owns it (through CgroupFS).
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic, young: float = 10.0,
                 rewalk: float = 60.0, read: Reader = read_kernel_file) -> None:
        self._clock = clock
        self._read = read  # of the leaves' cgroup.procs
        self._young = young
        self._rewalk = rewalk
        # step dir -> (first seen, last walked, its leaves then)
        self._steps: dict[str, tuple[float, float, tuple[str, ...]]] = {}
        # job dir -> (its link count, its step names) when the count matched the listing
        self._listed: dict[str, tuple[int, tuple[str, ...]]] = {}

    def pids(self, job_dir: str) -> frozenset[int]:
        """Pids in the leaves of every step of the job (empty when it is gone)."""
        try:
            links = os.stat(job_dir).st_nlink
        except OSError:
            self._listed.pop(job_dir, None)
            return frozenset()
        listed = self._listed.get(job_dir)
        if listed is not None and listed[0] == links:
            pids, complete = self._pids_of_steps(job_dir, listed[1])
            if complete:
                return pids
        pids, _ = self._pids_of_steps(job_dir, self._list_steps(job_dir, links))
        return pids

    def _list_steps(self, job_dir: str, links: int) -> tuple[str, ...]:
        entries = names(job_dir)
        # A step's name has no dot, so it is a directory, never an interface file.
        steps = tuple(name for name in entries if STEP_RE.fullmatch(name))
        subdirs = sum(1 for name in entries if "." not in name and name not in _V1_DOTLESS_FILES)
        if links == 2 + subdirs:
            self._listed[job_dir] = (links, steps)
        else:
            self._listed.pop(job_dir, None)
        return steps

    def _pids_of_steps(self, job_dir: str, steps: tuple[str, ...]
                       ) -> tuple[frozenset[int], bool]:
        """(pids of the steps' leaves, whether every step could be read: False when one
        is gone, so the listing may be stale)."""
        now = self._clock()
        pids: set[int] = set()
        complete = True
        for name in steps:
            step = f"{job_dir}/{name}"
            first, walked, leaves = self._steps.get(step, (now, now, ()))
            known = step in self._steps and now - first >= self._young \
                and now - walked < self._rewalk
            got = pids_of(leaves, self._read) if known else None
            if got is None:  # new, young, due, or a leaf vanished: walk the step again
                leaves, walked = tuple(leaves_of_step(step, False)), now
                got = pids_of(leaves, self._read)
            self._steps[step] = (first, walked, leaves)
            if got is None:  # the step is gone (or its cgroup.procs unreadable)
                complete = False
            pids.update(got or ())
        return frozenset(pids), complete

    def keep_only(self, live_dirs: set[str]) -> None:
        """Forget the steps of job directories not in ``live_dirs``."""
        self._steps = {s: v for s, v in self._steps.items()
                       if os.path.dirname(s) in live_dirs}
        self._listed = {d: v for d, v in self._listed.items() if d in live_dirs}


def pids_of(leaves: Iterable[str], read: Reader = read_kernel_file) -> frozenset[int] | None:
    """Pids of all the leaves; None as soon as one is gone (the list is stale)."""
    pids: set[int] = set()
    for leaf in leaves:
        got = read_procs(leaf, read)
        if got is None:
            return None
        pids.update(got)
    return frozenset(pids)
