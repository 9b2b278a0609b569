"""The GPU sampler: attributes each poll's readings to jobs, and exports the totals.

Busy time comes from the driver's own sample buffer: every sample newer than the
last one seen is integrated once (gpu/driver/integration.py), so a job's mean utilization
is exact whatever the scrape or sample interval. Per job run (job id and start
time) and GPU, allocated seconds, busy seconds and energy are counters that start
at 0 with the job and are saved in the state dir (gpu/attribution/counters.py), so a restart
of the agent never lowers them. Allocated time is wall-clock time held; busy time
and energy come from the driver, and a read that fails once leaves them where they
were (the driver's counters are cumulative, so the next good read counts what was
missed); so do throttled time and errors per job (gpu/attribution/throttle.py,
gpu/attribution/job_errors.py).
The last energy reading of each held GPU is saved too (gpu/attribution/energy.py): the first
reading after a restart counts the energy used while the agent was down, for the jobs
that held the GPU across that time. The backend itself is read in a worker thread
(gpu/polling.py); who uses and holds each GPU comes from gpu/attribution/usage.py; GPM activity
(SM, tensor, DRAM) is counted by gpu/attribution/activity.py, for the job that has a GPU or MIG
instance to itself. What each reading adds to which job is gpu/attribution/attributor.py's part.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slurm_gpu_exporter.exposition.snapshot import GpuSample, JobGpuSample, UnattributedSample
from slurm_gpu_exporter.gpu.attribution.attributor import GpuAttributor
from slurm_gpu_exporter.gpu.attribution.ledger import Poll
from slurm_gpu_exporter.gpu.attribution.samples import job_gpu_samples
from slurm_gpu_exporter.gpu.backend import GpuBackend
from slurm_gpu_exporter.gpu.polling import BackendLink
from slurm_gpu_exporter.gpu.readings import DeviceReading, HostClocks
from slurm_gpu_exporter.jobs.job import Job
from slurm_gpu_exporter.jobs.source import SampleContext, SourceDefaults
from slurm_gpu_exporter.node.cgroup import CgroupFS
from slurm_gpu_exporter.node.procfs import PidJobMapper
from slurm_gpu_exporter.node.source_health import SourceErrors
from slurm_gpu_exporter.node.state_dir import of_this_boot, read_boot_id, stamp_boot


@dataclass(frozen=True)
class GpuPartResult:
    """What the GPU sampler adds to a snapshot."""

    nvml_up: bool
    job_gpus: tuple[JobGpuSample, ...] = ()
    gpus: tuple[GpuSample, ...] = ()
    unattributed: tuple[UnattributedSample, ...] = ()


class GpuTotals:
    """The GPU sampler's parts, the backend link and the attribution, and what they add
    up to: each poll's readings given to jobs, the figures kept while the backend is
    down or stuck, and what the state dir keeps."""

    def __init__(
        self,
        backend: GpuBackend,
        proc_root: Path,
        errors: SourceErrors,
        *,
        cgroups: CgroupFS | None = None,
        poll_timeout: float = 4.0,
        reinit_after: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.link = BackendLink(backend, errors, poll_timeout=poll_timeout,
                                reinit_after=reinit_after, clock=clock)
        self.errors = errors
        self.cgroups = cgroups
        self.attribution = GpuAttributor(proc_root, self.link.xids)
        # The attribution's parts, under the names the rest of the agent reads.
        self.users = self.attribution.users
        self.devices = self.attribution.devices
        self.energy = self.attribution.energy
        self.counters = self.attribution.counters
        self.activity = self.attribution.activity
        self.health = self.attribution.health
        self._last_part = GpuPartResult(nvml_up=False)
        # Driver timestamps restart with the boot and may with the driver: cursors are
        # saved with both, and kept only for the same ones.
        self.boot_id = read_boot_id(proc_root)

    @property
    def mapper(self) -> PidJobMapper:
        return self.users.mapper

    @mapper.setter
    def mapper(self, mapper: PidJobMapper) -> None:
        self.users.mapper = mapper

    def close(self) -> None:
        """Stop the worker threads and release the backend."""
        self.link.close()

    # -- attribution ---------------------------------------------------------

    def _attribute(self, jobs: list[Job], readings: list[DeviceReading], now: float
                   ) -> GpuPartResult:
        running = [j for j in jobs if j.running]
        key_to_job = {j.jobid: j for j in running}
        for job in running:  # Slurm 26.05: cgroup paths name jobs by SLUID
            if job.cgroup is not None and job.cgroup.is_sluid:
                key_to_job[job.cgroup.job_key] = job
        poll = Poll(jobs, now, running, key_to_job, [], [], set(), set())
        for reading in readings:
            for error in reading.errors:
                self.errors.count("nvml", f"GPU {reading.index}: {error}")
            if reading.lost:
                self.errors.count("nvml", f"GPU {reading.index} ({reading.uuid}) is lost",
                                  log_it=False)
                self.attribution.hold_lost(reading, poll)
                poll.devices.append(self.attribution.device_sample(reading, None, None))
            else:
                self.attribution.attribute_gpu(reading, poll)
        present = {r.uuid for r in readings} | {m.uuid for r in readings for m in r.mig}
        self.devices.prune(present)
        self.energy.prune(present)
        self.health.prune(present)
        self.counters.prune_gpus(present)
        self.activity.prune(present)
        self.link.xids.prune(present)
        self._forget(jobs, poll.seen_pids)
        return GpuPartResult(nvml_up=True,
                             job_gpus=job_gpu_samples(self.counters, jobs, poll.touched),
                             gpus=tuple(poll.devices), unattributed=tuple(poll.unattributed))

    def _forget(self, jobs: list[Job], seen_pids: set[int]) -> None:
        """Drop what belongs to jobs and processes no longer around."""
        tracked = {j.jobid for j in jobs}
        self.counters.forget_runs({(j.jobid, j.start_time) for j in jobs}, tracked)
        self.users.forget(seen_pids)

    def _frozen(self, jobs: list[Job], now: float) -> GpuPartResult:
        """The last figures (NVML down or stuck): only the time held goes on."""
        for job in jobs:
            if job.running:
                for c in (self.counters.of_run((job.jobid, job.start_time)) or {}).values():
                    if c.held_until is not None:
                        self.attribution.hold(c, job, now, 0.0)
        return GpuPartResult(nvml_up=False,
                             job_gpus=job_gpu_samples(self.counters, jobs, touched=None),
                             gpus=self._last_part.gpus,
                             unattributed=self._last_part.unattributed)

    # -- state dir ----------------------------------------------------------

    def export_state(self) -> dict[str, Any]:
        devices = self.devices.export_state()
        cursors = stamp_boot(devices.pop("cursors_by_gpu"), self.boot_id,
                             self.link.driver or self.devices.restored_driver)
        return {"sample_cursors": cursors, **self.energy.export_state(self.boot_id), **devices,
                **self.counters.export_state(), **self.activity.export_state(),
                **self.health.export_state(self.boot_id)}

    def import_state(self, data: dict[str, Any]) -> None:
        by_gpu, driver = of_this_boot(data.get("sample_cursors"), self.boot_id)
        self.devices.import_state(data, by_gpu, driver)
        self.energy.import_state(data, self.boot_id)
        self.health.import_state(data, self.boot_id)
        self.counters.import_state(data)
        self.activity.import_state(data)


class GpuSampler(GpuTotals, SourceDefaults):
    """Turns backend readings into job-GPU and device samples; owned by the sampler thread.
    As a source of the sample loop it polls the backend each sample and reads the
    drivers' sample buffers between samples."""

    # As a source of the sample: the GPUs, with the tracker's jobs to attribute them to;
    # it also reads the drivers' sample buffers between samples.
    name = "nvml"
    health_names = ("nvml",)
    state_key = "gpu"

    def take(self, ctx: SampleContext) -> GpuPartResult:
        return self.sample(ctx.jobs, ctx.now)

    def up(self, part: GpuPartResult | None) -> bool:
        return part is not None and part.nvml_up  # a missing library counts only on retry

    def snapshot_fields(self, part: GpuPartResult | None) -> dict[str, Any]:
        if part is None:
            return {"nvml_up": False}
        return {"nvml_up": part.nvml_up, "job_gpus": part.job_gpus, "gpus": part.gpus,
                "unattributed": part.unattributed}

    def between_samples(self) -> float | None:
        return self.buffer_read_interval()

    def read_between(self) -> None:
        self.read_buffers()

    def lazy_state(self) -> tuple[str, float] | None:
        """The sample cursors may be written up to two buffer-read intervals late (half
        the drivers' buffer span): a restart reads on from an older cursor and finds every
        sample since it still in the buffer, so it counts what it would have counted."""
        every = self.buffer_read_interval()
        return ("sample_cursors", 2 * every) if every else None

    def sample(self, jobs: list[Job], now: float) -> GpuPartResult:
        if self.attribution.first_poll is None:
            self.attribution.first_poll = now
        readings = self.link.read(self.devices.driver_cursors())
        self.devices.driver_seen(self.link.generation, self.link.driver)
        self.energy.driver_seen(self.link.driver)
        self.health.driver_seen(self.link.driver)
        if readings is None:
            # Down, or a read still in flight. Nothing is lost while the driver's buffers
            # hold what the next read finds: its lateness decides (gpu/driver/buffers.py), as for
            # a stalled agent. A driver that comes back is a new init: cursors start over.
            self._last_part = self._frozen(jobs, now)
            return self._last_part
        if self.cgroups is not None:
            # The mapper's one input from outside: where Slurm's job cgroups are now
            # (a root can appear late). Without any, it goes by the environment.
            self.users.mapper.slurm_roots = self.cgroups.proc_roots()
        self._last_part = self._attribute(jobs, readings, now)
        return self._last_part

    def buffer_read_interval(self) -> float | None:
        """Seconds between reads of the driver's sample buffers that keep them from
        overrunning unseen (gpu/driver/buffers.py); None where the backend cannot read them
        alone or no GPU has them."""
        if getattr(self.link.backend, "read_buffers", None) is None:
            return None
        return self.devices.read_interval()

    def read_buffers(self) -> None:
        """Read the sample buffers alone, between two samples; the next sample counts
        what they held."""
        reads = self.link.read_buffers(self.devices.buffers.read_cursors(self.devices.cursors))
        if reads:
            self.devices.keep_reads(reads, HostClocks.now())
