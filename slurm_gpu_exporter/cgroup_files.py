"""Small readers of cgroup files and directories, shared by the v1 and v2 readers.

Each returns None (or nothing) for a file that is missing or odd: files of a cgroup
being removed vanish one by one, and one odd file must not fail the whole job.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from slurm_gpu_exporter.base import read_kernel_file
from slurm_gpu_exporter.cgroup_paths import STEP_RE

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


# The helpers below run for every job on every sample: they take plain string
# paths, which costs a fraction of building pathlib objects.


def read_text(path: str) -> str | None:
    """One cgroup file's content, or None when it is missing or unreadable.

    Any OSError counts: a file of a cgroup being removed can fail with ENOENT,
    ENODEV or EINVAL, and one odd file must not fail the whole job.
    """
    try:
        return read_kernel_file(path).decode("ascii", "replace")
    except OSError:
        return None


def read_int(path: str) -> int | None:
    text = read_text(path)
    if text is None:
        return None
    try:
        return int(text.strip())
    except ValueError:
        return None


def read_keyed(path: str, key: str) -> int | None:
    """Value of ``key`` in a flat-keyed file such as memory.stat or cpu.stat."""
    text = read_text(path)
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


def read_procs(directory: str) -> list[int] | None:
    """Pids in one cgroup; None when the cgroup is gone."""
    text = read_text(directory + "/cgroup.procs")
    if text is None:
        return None
    pids = []
    for line in text.split():
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


def step_leaves(job_dir: str, skip_stepd_leaf: bool) -> list[str]:
    """The leaf cgroups of the job's steps: where Slurm puts the job's processes.

    Slurm keeps slurmstepd above the leaves (job-level freezer cgroup, step-level
    memory/devices cgroups on v1) or in the v2 leaf ``step_<s>/slurm``, skipped here.
    """
    leaves = []
    steps = [f"{job_dir}/{step}" for step in child_cgroups(job_dir) if STEP_RE.fullmatch(step)]
    stack = [(step, True) for step in steps]
    while stack:
        d, is_step = stack.pop()
        children = child_cgroups(d)
        if not children:
            leaves.append(d)
        for child in children:
            if not (skip_stepd_leaf and is_step and child == "slurm"):
                stack.append((f"{d}/{child}", False))
    return leaves


def pids_of(leaves: Iterable[str]) -> frozenset[int] | None:
    """Pids of all the leaves; None as soon as one is gone (the list is stale)."""
    pids: set[int] = set()
    for leaf in leaves:
        got = read_procs(leaf)
        if got is None:
            return None
        pids.update(got)
    return frozenset(pids)
