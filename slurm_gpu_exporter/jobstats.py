"""Per-job CPU and memory figures from cgroups (processes where cgroups lack them).

Keeps what must not go backwards across samples and restarts: CPU seconds
gathered from processes (nodes without cpuacct job cgroups) and memory peaks
where the kernel keeps none. An ended job keeps its last figures while it
lingers, so its final values are scraped.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from slurm_gpu_exporter.allocation import gpu_allocation
from slurm_gpu_exporter.cgroups import CgroupFS, CgroupGone
from slurm_gpu_exporter.errors import SourceErrors
from slurm_gpu_exporter.procfs import ProcessCpuAccumulator
from slurm_gpu_exporter.registry import Job
from slurm_gpu_exporter.snapshot import JobSample


class JobStatsCollector:
    """Turns the registry's jobs into JobSamples; thread-confined to the sampler."""

    def __init__(self, cgroups: CgroupFS | None, proc_root: Path, errors: SourceErrors) -> None:
        self.cgroups = cgroups
        self.errors = errors
        self.cpu_from_processes = ProcessCpuAccumulator(proc_root)
        self._last: dict[str, JobSample] = {}
        # Floors restored from the state dir: a restart must not lower a counter.
        self._cpu_floor: dict[str, float] = {}
        self._peak_floor: dict[str, int] = {}

    def collect(self, jobs: list[Job]) -> list[JobSample]:
        samples = []
        for job in jobs:
            sample = self._sample(job) if job.running else self._final(job)
            self._last[job.jobid] = sample
            samples.append(sample)
        tracked = {job.jobid for job in jobs}
        for jobid in [j for j in self._last if j not in tracked]:
            del self._last[jobid]
            self._cpu_floor.pop(jobid, None)
            self._peak_floor.pop(jobid, None)
            self.cpu_from_processes.forget(jobid)
        return samples

    def _final(self, job: Job) -> JobSample:
        """An ended job: its last figures, without the gauges that no longer mean anything."""
        return self._without_cgroup(job, gpu_allocation(job.job_gpus,
                                                        job.cuda_visible_devices).count)

    def _without_cgroup(self, job: Job, gpus: int) -> JobSample:
        """The last figures seen (or restored from the state dir), nothing running."""
        last = self._last.get(job.jobid)
        if last is None or (last.cpu_seconds is None and last.memory_peak_bytes is None):
            return JobSample(
                job=job, gpus=gpus,
                cpu_seconds=self._cpu_floor.get(job.jobid),
                memory_peak_bytes=self._peak_floor.get(job.jobid),
            )
        return replace(last, job=job, gpus=gpus, memory_used_bytes=0, processes=0)

    def _sample(self, job: Job) -> JobSample:
        gpus = gpu_allocation(job.job_gpus, job.cuda_visible_devices).count
        if job.cgroup is None or self.cgroups is None:
            # No cgroup (yet, or any more: Slurm removes it before the epilog runs):
            # keep the counters seen so far rather than dropping the series.
            return self._without_cgroup(job, gpus)
        try:
            stats = self.cgroups.read_stats(job.cgroup)
        except CgroupGone:
            return self._without_cgroup(job, gpus)
        except OSError as exc:
            self.errors.count("cgroup", f"job {job.jobid}: cannot read its cgroup: {exc}")
            return JobSample(job=job, gpus=gpus)
        cpu = stats.cpu_seconds
        if cpu is None:
            cpu = self.cpu_from_processes.update(job.jobid, stats.pids)
        cpu = max(cpu, self._cpu_floor.get(job.jobid, 0.0))
        peak = stats.memory_peak_bytes
        floor = self._peak_floor.get(job.jobid)
        if peak is None and stats.memory_used_bytes is not None:
            peak = max(stats.memory_used_bytes, floor or 0)
        if peak is not None:
            self._peak_floor[job.jobid] = peak
        self._cpu_floor[job.jobid] = cpu
        return JobSample(
            job=job,
            gpus=gpus,
            cpus=stats.cpus,
            cpu_seconds=cpu,
            memory_used_bytes=stats.memory_used_bytes,
            memory_limit_bytes=stats.memory_limit_bytes,
            memory_peak_bytes=peak,
            oom_kills=stats.oom_kills,
            processes=len(stats.pids),
        )

    # -- state dir ----------------------------------------------------------

    def export_state(self) -> dict[str, Any]:
        return {
            jobid: {"cpu_seconds": self._cpu_floor.get(jobid),
                    "memory_peak_bytes": self._peak_floor.get(jobid),
                    "cpu_from_processes": self.cpu_from_processes.export_job(jobid)}
            for jobid in self._last
        }

    def import_state(self, data: dict[str, Any]) -> None:
        for jobid, values in data.items():
            if not isinstance(values, dict):
                continue
            cpu = values.get("cpu_seconds")
            peak = values.get("memory_peak_bytes")
            if values.get("cpu_from_processes") is not None:
                self.cpu_from_processes.import_job(jobid, values["cpu_from_processes"])
            if isinstance(cpu, int | float):
                self._cpu_floor[jobid] = float(cpu)
            if isinstance(peak, int):
                self._peak_floor[jobid] = peak
