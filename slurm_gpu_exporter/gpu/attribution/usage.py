"""Who uses and who holds a GPU in one poll: processes mapped to jobs (or, outside
every job, to users), and the running jobs whose allocation covers it."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from slurm_gpu_exporter.gpu.attribution.shares import UNATTRIBUTED, GpuTarget, held_targets
from slurm_gpu_exporter.gpu.readings import GpuProcess, ProcessUtilSample
from slurm_gpu_exporter.hooks.ids import user_name
from slurm_gpu_exporter.jobs.job import Job
from slurm_gpu_exporter.node.procfs import PidJobMapper, ProcessGone, read_uid


@dataclass
class Usage:
    """One target's users in one poll: processes, memory and SM weights by job id
    (``UNATTRIBUTED`` for processes outside every job), and those outside by user."""

    memory: dict[str, int] = field(default_factory=dict)
    processes: dict[str, int] = field(default_factory=dict)
    weight: dict[str, float] = field(default_factory=dict)
    unattributed: dict[str, tuple[int, int]] = field(default_factory=dict)  # user -> (n, bytes)
    unattributed_weight: dict[str, float] = field(default_factory=dict)  # user -> SM weight


UNKNOWN_USER = "unknown"  # the user of a GPU process /proc does not show


class UsageReader:
    """Maps a GPU's processes to the running jobs, through /proc and the cgroups.

    Remembers, for as long as the processes live, the user of each process outside
    every job.
    """

    def __init__(self, proc_root: Path) -> None:
        self.proc_root = proc_root
        self.mapper = PidJobMapper(proc_root)
        self._users: dict[int, str] = {}

    def usage(self, processes: Iterable[GpuProcess],
              process_samples: Iterable[ProcessUtilSample], key_to_job: dict[str, Job],
              seen_pids: set[int]) -> Usage:
        """Who uses the GPU: processes, memory and SM weights by job (or user, outside jobs)."""
        usage = Usage()
        weights: dict[int, float] = {}
        for sample in process_samples:
            weights[sample.pid] = weights.get(sample.pid, 0.0) + sample.sm_percent
        for proc in processes:
            seen_pids.add(proc.pid)
            pid_job = self.mapper.job_of(proc.pid)
            job = key_to_job.get(pid_job.job_key) if pid_job is not None else None
            memory = proc.used_memory or 0
            if job is None:
                # A PID NVML lists that /proc cannot resolve (it exited between NVML's list
                # and this look, or lives in another PID namespace) is still use outside
                # every job: its memory was on the GPU.
                user = self._user_of(proc.pid) or UNKNOWN_USER
                n, mem = usage.unattributed.get(user, (0, 0))
                usage.unattributed[user] = (n + 1, mem + memory)
                usage.unattributed_weight[user] = (usage.unattributed_weight.get(user, 0.0)
                                                   + weights.get(proc.pid, 0.0))
                key = UNATTRIBUTED
            else:
                key = job.jobid
            usage.memory[key] = usage.memory.get(key, 0) + memory
            usage.processes[key] = usage.processes.get(key, 0) + 1
            usage.weight[key] = usage.weight.get(key, 0.0) + weights.get(proc.pid, 0.0)
        return usage

    def holders(self, target: GpuTarget, running: list[Job]) -> list[str]:
        """Ids of the running jobs whose allocation covers the target."""
        # Most jobs on a node hold no GPU: skip them before building sets (per GPU).
        return [j.jobid for j in running
                if j.allocation.count and held_targets(j.allocation, [target])]

    def forget(self, seen_pids: set[int]) -> None:
        """Drop the users of processes no longer seen."""
        for pid in [p for p in self._users if p not in seen_pids]:
            del self._users[pid]

    def _user_of(self, pid: int) -> str | None:
        if pid in self._users:
            return self._users[pid]
        try:
            uid = read_uid(self.proc_root, pid)
        except (ProcessGone, ValueError, OSError):
            return None
        name = user_name(uid) or str(uid)
        self._users[pid] = name
        return name
