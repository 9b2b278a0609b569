"""cgroup v1 (Slurm's ``cgroup/v1`` plugin): one tree per controller.

Finds Slurm's ``slurm*`` roots in each hierarchy, the job directories below them,
and reads one job's accounting from its controller directories.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

from slurm_gpu_exporter.node.cgroup.files import (
    NO_LIMIT,
    PartialStats,
    Reader,
    SteadyFiles,
    StepLeaves,
    limit_or_none,
    names,
    read_cpus,
    read_int,
    read_keyed,
    subdirs,
)
from slurm_gpu_exporter.node.cgroup.paths import JOB_RE, UID_RE, V1_TOP_RE
from slurm_gpu_exporter.node.kernelfile import read_kernel_file

# v1 memory cgroups report "no limit" as PAGE_COUNTER_MAX pages (about 2**63 bytes,
# rounded down to the page size); anything this large is no real limit.
V1_UNLIMITED = 1 << 60

# v1 trees to list a job's processes from, best first. Slurm 22.05 keeps slurmstepd
# in the job-level freezer cgroup and in the step-level memory/devices/cpuset
# cgroups; the tasks sit in the leaves below (freezer step_<s>, task_<n> elsewhere).
# freezer (proctrack/cgroup) holds every process of every step; cpuset, whose
# step cgroups are leaves shared with slurmstepd, is the last resort.
V1_PID_SOURCES = ("freezer", "cpuacct", "memory", "devices", "cpuset")

Roots = list[tuple[frozenset[str], str]]  # (controllers, Slurm tree root)


def slurm_tops(hierarchy: str) -> list[str]:
    """The ``slurm*`` roots directly under one v1 hierarchy."""
    return [e.path for e in subdirs(hierarchy) if V1_TOP_RE.fullmatch(e.name)]


def scan_v1_roots(root: Path) -> tuple[Roots, dict[str, frozenset[str]]]:
    """(Slurm roots, hierarchies without one: real path -> controllers) under ``root``."""
    # Group mount points by their real directory: "cpu" and "cpuacct" are often
    # symlinks to one "cpu,cpuacct" hierarchy, which must be read once.
    hierarchies: dict[str, set[str]] = {}
    try:
        with os.scandir(root) as it:
            entries = [e for e in it if e.is_dir()]
    except (FileNotFoundError, NotADirectoryError):
        return [], {}
    for entry in entries:
        real = os.path.realpath(entry.path)
        names = hierarchies.setdefault(real, set())
        names.update(n for n in entry.name.split(",") if n)
        names.update(n for n in os.path.basename(real).split(",") if n)
    roots: Roots = []
    bare: dict[str, frozenset[str]] = {}
    for real, names in sorted(hierarchies.items()):
        tops = slurm_tops(real)
        if not tops:
            bare[real] = frozenset(names)
        roots.extend((frozenset(names), top) for top in tops)
    return roots, bare


def jobs_under_v1(top: str, watch: Callable[[str], None] | None = None
                  ) -> Iterator[tuple[str, int | None, bool, str]]:
    """(job id, uid, False, job dir) for every ``uid_<uid>/job_<id>`` under a Slurm root.

    By name alone: such a name has no dot, so in a cgroup tree it is a directory,
    never an interface file. Most names are interface files: a prefix test skips them
    before the pattern. cgroupfs (v1 and v2, kernel 6.18) does not change a
    directory's mtime when a child cgroup is made or removed; ``watch`` is called on
    the root and each ``uid_<n>`` dir before it is listed (watch.DirWatch: inotify
    tells of a change, and the caller lists again only then)."""
    if watch is not None:
        watch(top)
    for uid_name in names(top):
        uid_m = UID_RE.fullmatch(uid_name) if uid_name.startswith("uid_") else None
        if uid_m is None:
            continue
        uid_dir = f"{top}/{uid_name}"
        if watch is not None:
            watch(uid_dir)
        for job_name in names(uid_dir):
            job_m = JOB_RE.fullmatch(job_name) if job_name.startswith("job_") else None
            if job_m is not None:
                yield job_m.group(1), int(uid_m.group(1)), False, f"{uid_dir}/{job_name}"


def _read_job_cpus(cpuset: str) -> frozenset[int] | None:
    return read_cpus(f"{cpuset}/cpuset.effective_cpus") or read_cpus(f"{cpuset}/cpuset.cpus")


def _read_limit(path: str) -> int | None:
    """memory.limit_in_bytes: bytes, NO_LIMIT where unlimited, None where unreadable."""
    limit = read_int(path)
    return NO_LIMIT if limit is not None and limit >= V1_UNLIMITED else limit


def read_v1(dirs: Mapping[str, Path], steady: SteadyFiles, leaves: StepLeaves,
            read: Reader = read_kernel_file) -> PartialStats:
    """One job's accounting from its controller directories (one slurmd instance).

    The cpuset and the memory limit come through ``steady`` (not read every sample),
    the processes through ``leaves`` (steps' leaf cgroups remembered)."""
    out = PartialStats()
    if "cpuacct" in dirs:
        usage_ns = read_int(f"{dirs['cpuacct']}/cpuacct.usage", read)
        out.cpu_seconds = usage_ns / 1e9 if usage_ns is not None else None
        out.missing = usage_ns is None
    if "cpuset" in dirs:
        # Keyed by a file path in the job directory, so that keep_only finds it.
        out.cpus = steady.get(f"{os.fspath(dirs['cpuset'])}/cpuset.effective_cpus",
                              lambda path: _read_job_cpus(os.path.dirname(path)))  # type: ignore[assignment]
    if "memory" in dirs:
        memory = os.fspath(dirs["memory"])
        usage = read_int(f"{memory}/memory.usage_in_bytes", read)
        # total_* counts the whole subtree: the job's pages sit in its task cgroups.
        inactive = read_keyed(f"{memory}/memory.stat", "total_inactive_file", read)
        if usage is not None:
            out.memory_used = max(0, usage - (inactive or 0))
        out.memory_limit = limit_or_none(steady.get(f"{memory}/memory.limit_in_bytes",
                                                    _read_limit))
        out.memory_peak = read_int(f"{memory}/memory.max_usage_in_bytes", read)
        out.oom_kills = read_keyed(f"{memory}/memory.oom_control", "oom_kill", read)
        out.missing = out.missing or usage is None or out.memory_peak is None
    for ctrl in V1_PID_SOURCES:
        if ctrl in dirs:
            job_dir = os.fspath(dirs[ctrl])
            pids = leaves.pids(job_dir)
            # No pids from a tree that is not there: the next tree may have them.
            if pids or os.path.isdir(job_dir):
                out.pids = pids
                break
    else:
        out.missing = out.missing or any(ctrl in dirs for ctrl in V1_PID_SOURCES)
    return out
