"""cgroup v2 (Slurm's ``cgroup/v2`` plugin): one unified tree.

Finds slurmstepd's scopes (below nested systemd slices), the job directories in
them, and reads one job's accounting from its directory.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

from slurm_gpu_exporter.node.cgroup.files import (
    NO_LIMIT,
    UNIFIED,
    PartialStats,
    Reader,
    SteadyFiles,
    limit_or_none,
    pids_of,
    read_cpus,
    read_int,
    read_keyed,
    read_text,
    step_leaves,
    subdirs,
)
from slurm_gpu_exporter.node.cgroup.paths import SCOPE_RE, job_dir_key
from slurm_gpu_exporter.node.kernelfile import read_kernel_file

SLICE_DEPTH = 4  # how deep nested systemd slices (a.slice/a-b.slice/...) are searched


def scan_v2_roots(root: Path) -> list[str]:
    """slurmstepd scopes under ``root``, sorted."""
    roots = []
    stack = [(os.fspath(root), 0)]
    while stack:
        directory, depth = stack.pop()
        for entry in subdirs(directory):
            if SCOPE_RE.fullmatch(entry.name):
                roots.append(entry.path)
            elif entry.name.endswith(".slice") and depth < SLICE_DEPTH:
                stack.append((entry.path, depth + 1))
    return sorted(roots)


def jobs_under_v2(top: str, watch: Callable[[str], None] | None = None
                  ) -> Iterator[tuple[str, int | None, bool, str]]:
    """(job key, None, is_sluid, job dir) for every job directory in a scope.

    ``watch`` is called on the scope before it is listed (watch.DirWatch); the jobs'
    own directories are never watched."""
    if watch is not None:
        watch(top)
    for entry in subdirs(top):
        key = job_dir_key(entry.name)
        if key is not None:
            yield key[0], None, key[1], entry.path


def _read_max(path: str) -> int | None:
    """memory.max: bytes, NO_LIMIT for "max", None for anything odd or unreadable."""
    text = read_text(path)
    if text is None:
        return None
    if text.strip() == "max":
        return NO_LIMIT
    try:
        return int(text.strip())
    except ValueError:
        return None


class V2Reader:
    """Reads v2 job directories, remembering each job's leaf cgroups between samples."""

    def __init__(self, steady: SteadyFiles, read: Reader = read_kernel_file) -> None:
        # job dir -> (nr_descendants, leaf cgroups) when last walked.
        self._leaves: dict[str, tuple[int, tuple[str, ...]]] = {}
        self._steady = steady
        self._read = read

    def keep_only(self, live: set[str]) -> None:
        """Forget the leaves of job directories not in ``live``."""
        self._leaves = {d: v for d, v in self._leaves.items() if d in live}

    def _pids(self, job_dir: str) -> frozenset[int]:
        # Listing every directory of a job's subtree costs more than reading it:
        # the leaves are remembered while cgroup.stat's nr_descendants is unchanged
        # (a leaf that vanished in between also forces a fresh walk).
        count = read_keyed(f"{job_dir}/cgroup.stat", "nr_descendants", self._read)
        cached = self._leaves.get(job_dir)
        if count is not None and cached is not None and cached[0] == count:
            pids = pids_of(cached[1], self._read)
            if pids is not None:
                return pids
        leaves = tuple(step_leaves(job_dir, True))
        if count is not None:
            self._leaves[job_dir] = (count, leaves)
        return pids_of(leaves, self._read) or frozenset()

    def read(self, dirs: Mapping[str, Path]) -> PartialStats:
        """One job's accounting from its directory (one slurmd instance)."""
        out = PartialStats()
        if UNIFIED not in dirs:
            return out
        job_dir = os.fspath(dirs[UNIFIED])
        read = self._read
        usage_usec = read_keyed(f"{job_dir}/cpu.stat", "usage_usec", read)
        out.cpu_seconds = usage_usec / 1e6 if usage_usec is not None else None
        out.cpus = self._steady.get(f"{job_dir}/cpuset.cpus.effective", read_cpus)  # type: ignore[assignment]
        current = read_int(f"{job_dir}/memory.current", read)
        inactive = read_keyed(f"{job_dir}/memory.stat", "inactive_file", read)
        if current is not None:
            out.memory_used = max(0, current - (inactive or 0))
        out.memory_limit = limit_or_none(self._steady.get(f"{job_dir}/memory.max", _read_max))
        out.memory_peak = read_int(f"{job_dir}/memory.peak", read)  # Linux 5.19 and later
        out.oom_kills = read_keyed(f"{job_dir}/memory.events", "oom_kill", read)
        out.pids = self._pids(job_dir)
        # cpu.stat is there even without the cpu controller; memory.current is not.
        out.missing = usage_usec is None or (current is None and out.oom_kills is None)
        return out
