"""Per-job CPU and memory figures from cgroups (processes where cgroups lack them).

Keeps what must not go backwards across samples and restarts: CPU seconds
gathered from processes (nodes without cpuacct job cgroups) and memory peaks
where the kernel keeps none. An ended job keeps its last figures while it
lingers, so its final values are scraped.

Everything is kept per run of a job: by job id and start time. A job requeued onto
this node keeps its id, and its new run counts from zero, not from the old total.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path
from typing import Any

from slurm_gpu_exporter.exposition.snapshot import JobSample
from slurm_gpu_exporter.jobs.job import Job
from slurm_gpu_exporter.jobs.source import SampleContext, SourceDefaults
from slurm_gpu_exporter.node.cgroup import CgroupFS, CgroupGone
from slurm_gpu_exporter.node.procfs import ProcessCpuAccumulator
from slurm_gpu_exporter.node.source_health import SourceErrors

# Floors restored from the state dir for a run no sample has shown are dropped after
# this many samples (the tracker may need a few to find a job again after a restart).
RESTORED_FLOOR_SAMPLES = 60

log = logging.getLogger(__name__)

RunKey = tuple[str, float | None]  # (job id, start time): one run of a job


def run_key(job: Job) -> RunKey:
    return (job.jobid, job.start_time)


def _gpu_count(job: Job) -> int:
    return job.allocation.count


def _process_key(key: RunKey) -> str:
    """The ProcessCpuAccumulator key of one run."""
    return f"{key[0]}@{key[1]!r}"


class JobStatsCollector(SourceDefaults):
    """Turns the tracker's jobs into JobSamples; thread-confined to the sampler."""

    def __init__(self, cgroups: CgroupFS | None, proc_root: Path, errors: SourceErrors) -> None:
        self.cgroups = cgroups
        self.errors = errors
        self.cpu_from_processes = ProcessCpuAccumulator(proc_root)
        self._last: dict[RunKey, JobSample] = {}
        # What must not go down: the last values, and those restored from the state dir.
        self._cpu_floor: dict[RunKey, float] = {}
        self._peak_floor: dict[RunKey, int] = {}
        # Restored runs no sample has shown yet -> samples left before they are dropped.
        self._unclaimed: dict[RunKey, int] = {}

    # As a source of the sample: each job's CPU and memory, from its cgroup.
    name = "cgroup"
    health_names = ("cgroup",)
    state_key = "jobs"

    def take(self, ctx: SampleContext) -> list[JobSample]:
        return self.collect(ctx.jobs)

    def failed_part(self) -> list[JobSample]:
        return []

    def snapshot_fields(self, part: list[JobSample]) -> dict[str, Any]:
        return {"jobs": tuple(part)}

    def collect(self, jobs: list[Job]) -> list[JobSample]:
        """One sample of every job the tracker reports, running or lingering."""
        samples = []
        for job in jobs:
            key = run_key(job)
            self._unclaimed.pop(key, None)
            if (job.jobid, None) in self._unclaimed and key not in self._last:
                self._adopt_unkeyed(job.jobid, key)
            try:
                sample = self._sample(job, key) if job.running else self._final(job, key)
            except Exception as exc:  # one job's fault costs that job's figures alone
                log.debug("job %s: figures not collected", job.jobid, exc_info=True)
                self.errors.count("cgroup", f"job {job.jobid}: cannot collect its CPU and "
                                  f"memory figures: {exc!r}")
                samples.append(JobSample(job=job.info(), gpus=_gpu_count(job)))
                continue
            self._last[key] = sample
            samples.append(sample)
        tracked = {run_key(job) for job in jobs}
        for key in [k for k in self._last if k not in tracked]:
            del self._last[key]
            self._forget(key)
        for key in list(self._unclaimed):
            self._unclaimed[key] -= 1
            if self._unclaimed[key] <= 0:
                del self._unclaimed[key]
                self._forget(key)
        return samples

    def _adopt_unkeyed(self, jobid: str, key: RunKey) -> None:
        """State saved before runs were told apart (no start time) goes to the job's run."""
        old: RunKey = (jobid, None)
        del self._unclaimed[old]
        if old in self._cpu_floor:
            self._cpu_floor[key] = self._cpu_floor.pop(old)
        if old in self._peak_floor:
            self._peak_floor[key] = self._peak_floor.pop(old)
        saved = self.cpu_from_processes.export_job(_process_key(old))
        if saved is not None:
            self.cpu_from_processes.forget(_process_key(old))
            self.cpu_from_processes.import_job(_process_key(key), saved)

    def _forget(self, key: RunKey) -> None:
        self._cpu_floor.pop(key, None)
        self._peak_floor.pop(key, None)
        self.cpu_from_processes.forget(_process_key(key))

    def _final(self, job: Job, key: RunKey) -> JobSample:
        """An ended job: its last figures, without the gauges that no longer mean anything."""
        return self._without_cgroup(job, key, _gpu_count(job))

    def _without_cgroup(self, job: Job, key: RunKey, gpus: int) -> JobSample:
        """The last figures seen (or restored from the state dir), nothing running."""
        last = self._last.get(key)
        if last is None or (last.cpu_seconds is None and last.memory_peak_bytes is None):
            return JobSample(
                job=job.info(), gpus=gpus,
                cpu_seconds=self._cpu_floor.get(key),
                memory_peak_bytes=self._peak_floor.get(key),
            )
        return replace(last, job=job.info(), gpus=gpus, memory_used_bytes=0, processes=0)

    def _sample(self, job: Job, key: RunKey) -> JobSample:
        gpus = _gpu_count(job)
        if job.cgroup is None or self.cgroups is None:
            # No cgroup (yet, or any more: Slurm removes it before the epilog runs):
            # keep the counters seen so far rather than dropping the series.
            return self._without_cgroup(job, key, gpus)
        try:
            stats = self.cgroups.read_stats(job.cgroup)
        except CgroupGone:
            return self._without_cgroup(job, key, gpus)
        except OSError as exc:
            self.errors.count("cgroup", f"job {job.jobid}: cannot read its cgroup: {exc}")
            return JobSample(job=job.info(), gpus=gpus)
        cpu = stats.cpu_seconds
        if cpu is None:
            cpu = self.cpu_from_processes.update(_process_key(key), stats.pids)
        cpu = max(cpu, self._cpu_floor.get(key, 0.0))
        peak = stats.memory_peak_bytes
        floor = self._peak_floor.get(key)
        if peak is None and stats.memory_used_bytes is not None:
            peak = max(stats.memory_used_bytes, floor or 0)
        if peak is not None:
            self._peak_floor[key] = peak
        self._cpu_floor[key] = cpu
        return JobSample(
            job=job.info(),
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
        """What a restart needs to carry on each job's counters (JSON-ready), by job id."""
        return {
            jobid: {"start_time": start,
                    "cpu_seconds": self._cpu_floor.get((jobid, start)),
                    "memory_peak_bytes": self._peak_floor.get((jobid, start)),
                    "cpu_from_processes": self.cpu_from_processes.export_job(
                        _process_key((jobid, start)))}
            for jobid, start in self._last
        }

    def import_state(self, data: dict[str, Any]) -> None:
        """Restore export_state's figures; they apply to the run with the same start time."""
        for jobid, values in data.items():
            if not isinstance(values, dict):
                continue
            start = values.get("start_time")
            key = (jobid, float(start) if isinstance(start, int | float) else None)
            cpu = values.get("cpu_seconds")
            peak = values.get("memory_peak_bytes")
            if values.get("cpu_from_processes") is not None:
                self.cpu_from_processes.import_job(_process_key(key), values["cpu_from_processes"])
            if isinstance(cpu, int | float):
                self._cpu_floor[key] = float(cpu)
            if isinstance(peak, int):
                self._peak_floor[key] = peak
            self._unclaimed[key] = RESTORED_FLOOR_SAMPLES
