"""What every path of the GPU attribution adds to (gpu/attribution/attributor.py walks a
reading): the per-GPU parts (users and processes, the driver's samples, energy, health,
activity) and the per-job counters, and handing one target's figures to its jobs."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from slurm_gpu_exporter.exposition.snapshot import GpuSample, UnattributedSample
from slurm_gpu_exporter.gpu.attribution.activity import DeviceActivity, job_activity, sole_job
from slurm_gpu_exporter.gpu.attribution.counters import CounterStore, JobGpuCounters
from slurm_gpu_exporter.gpu.attribution.energy import EnergyCounters
from slurm_gpu_exporter.gpu.attribution.job_errors import HealthBook, HealthDelta
from slurm_gpu_exporter.gpu.attribution.samples import device_sample
from slurm_gpu_exporter.gpu.attribution.shares import UNATTRIBUTED, GpuTarget
from slurm_gpu_exporter.gpu.attribution.usage import Usage, UsageReader
from slurm_gpu_exporter.gpu.driver.integration import DeviceIntegrator
from slurm_gpu_exporter.gpu.readings import DeviceReading, GpmFigures
from slurm_gpu_exporter.gpu.xids import XidCounts
from slurm_gpu_exporter.jobs.job import Job


@dataclass
class Poll:
    """What one poll collects while it walks the readings."""

    jobs: list[Job]
    now: float
    running: list[Job]
    key_to_job: dict[str, Job]
    devices: list[GpuSample]
    unattributed: list[UnattributedSample]
    seen_pids: set[int]
    touched: set[tuple[str, str]]  # (job id, uuid) pairs with live figures


class Share(NamedTuple):
    """One job's part of a target's figures in one poll."""

    window: float
    busy: float | None
    energy: float | None
    unknown: float = 0.0  # seconds the driver's samples may have been lost in


class GpuLedger:
    """The parts the GPU attribution adds to, and the hand-out of a target's figures to
    the jobs that use or hold it; GpuAttributor walks each reading through them."""

    def __init__(self, proc_root: Path, xids: XidCounts) -> None:
        self.users = UsageReader(proc_root)
        self.devices = DeviceIntegrator()
        self.energy = EnergyCounters()
        self.counters = CounterStore()
        self.activity = DeviceActivity()
        self.xids = xids
        self.health = HealthBook(xids)
        self.first_poll: float | None = None  # wall time of the first sample
        self.idle_polls = 0  # readings that took the idle path (tests, benchmarks)

    def _count_activity(self, target: GpuTarget, figures: GpmFigures | None, jobids: set[str],
                        outside: bool, poll: Poll) -> None:
        """GPM figures to the target's totals and, where one job has it to itself, the job's."""
        self.activity.add(target.uuid, figures)
        job = poll.key_to_job.get(sole_job(jobids, outside) or "")
        if figures is not None and job is not None:
            self._counter(job, target).add_activity(job_activity(figures, job.start_time,
                                                                 poll.now))

    def _held_across(self, holders: Iterable[str], uuid: str, delta: HealthDelta, poll: Poll
                     ) -> set[str] | None:
        """After a restart: the jobs that held the target across the gap (None: no gap)."""
        if delta.gap_from is None:
            return None
        return self.counters.held_across([poll.key_to_job[j] for j in holders], uuid,
                                         delta.gap_from)

    def _give_health(self, target: GpuTarget, jobids: Iterable[str], delta: HealthDelta,
                     across: set[str] | None, poll: Poll) -> None:
        """The interval's throttled time and errors to each job on the target, in full."""
        for key in jobids:
            job = poll.key_to_job.get(key)
            if job is not None:
                delta.give(self._counter(job, target), job,
                           across is None or job.jobid in across)

    def _to_jobs(self, target: GpuTarget, usage: Usage, holders: Iterable[str], poll: Poll,
                 figures_of: Callable[[str, Job, JobGpuCounters], Share]) -> set[str]:
        """Each job that uses or holds ``target``: its held time, then its share of the
        target's figures (``figures_of``, by the job's key: its id or cgroup key), memory
        and processes. Returns their keys."""
        held = set(holders)
        jobids = held | set(usage.processes) - {UNATTRIBUTED}
        for jobid in jobids:
            job = poll.key_to_job.get(jobid)
            if job is None:
                continue
            poll.touched.add((job.jobid, target.uuid))
            c = self._counter(job, target)
            share = figures_of(jobid, job, c)
            if jobid in held:
                self.hold(c, job, poll.now, share.window, share.unknown)
            c.accrue(window=share.window, busy=share.busy, energy=share.energy,
                     memory=usage.memory.get(jobid, 0), processes=usage.processes.get(jobid, 0))
        return jobids

    def hold(self, c: JobGpuCounters, job: Job, now: float, window: float,
             unknown: float = 0.0) -> None:
        c.hold(now, job.start_time, self.first_poll or now, window, unknown)

    def _counter(self, job: Job, target: GpuTarget) -> JobGpuCounters:
        return self.counters.counter((job.jobid, job.start_time), target.uuid, target.gpu)

    def device_sample(self, reading: DeviceReading, busy: float | None,
                       utilization: float | None,
                       unattributed: dict[str, tuple[int, int]] | None = None) -> GpuSample:
        return device_sample(reading, busy, utilization, unattributed or {}, self.devices,
                             self.energy, self.xids.of(reading.uuid), self.activity,
                             self.health)
