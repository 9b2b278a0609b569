"""The GPU sampler: attributes each poll's readings to jobs, and exports the totals.

Busy time comes from the driver's own sample buffer: every sample newer than the
last one seen is integrated once (gpu/integration.py), so a job's mean utilization
is exact whatever the scrape or sample interval. Per job run (job id and start
time) and GPU, allocated seconds, busy seconds and energy are counters that start
at 0 with the job and are saved in the state dir (gpu/counters.py), so a restart
of the agent never lowers them. Allocated time is wall-clock time held; busy time
and energy come from the driver, and a read that fails once leaves them where they
were (the driver's counters are cumulative, so the next good read counts what was
missed). The last energy reading of each held GPU is saved too (gpu/energy.py): the
first reading after a restart counts the energy used while the agent was down, for
the jobs that held the GPU across that time. The backend itself is read in a worker
thread (gpu/polling.py); who uses and holds each GPU comes from gpu/usage.py; GPM
activity (SM, tensor, DRAM) is counted by gpu/activity.py, for the job that has a GPU
or MIG instance to itself.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slurm_gpu_exporter.exposition.snapshot import GpuSample, JobGpuSample, UnattributedSample
from slurm_gpu_exporter.gpu.activity import DeviceActivity, job_activity, sole_job
from slurm_gpu_exporter.gpu.attribution import (
    UNATTRIBUTED,
    GpuTarget,
    energy_shares,
    shares,
)
from slurm_gpu_exporter.gpu.backend import DeviceReading, GpmFigures, GpuBackend, MigInstance
from slurm_gpu_exporter.gpu.clocks import HostClocks, wall_to_driver_us
from slurm_gpu_exporter.gpu.counters import CounterStore, JobGpuCounters
from slurm_gpu_exporter.gpu.energy import EnergyCounters
from slurm_gpu_exporter.gpu.integration import DeviceIntegrator, since_start
from slurm_gpu_exporter.gpu.polling import BackendLink
from slurm_gpu_exporter.gpu.usage import UsageReader
from slurm_gpu_exporter.jobs.tracker import Job
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


@dataclass
class _Poll:
    """What one poll collects while it walks the readings."""

    jobs: list[Job]
    now: float
    running: list[Job]
    key_to_job: dict[str, Job]
    devices: list[GpuSample]
    unattributed: list[UnattributedSample]
    seen_pids: set[int]
    touched: set[tuple[str, str]]  # (job id, uuid) pairs with live figures


class GpuSampler:
    """Turns backend readings into job-GPU and device samples; owned by the sampler thread."""

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
        self.users = UsageReader(proc_root)
        self.devices = DeviceIntegrator()
        self.energy = EnergyCounters()
        self.counters = CounterStore()
        self.activity = DeviceActivity()
        self._first_poll: float | None = None  # wall time of the first sample
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

    def sample(self, jobs: list[Job], now: float) -> GpuPartResult:
        if self._first_poll is None:
            self._first_poll = now
        readings = self.link.read(self.devices.driver_cursors())
        self.devices.driver_seen(self.link.generation, self.link.driver)
        self.energy.driver_seen(self.link.driver)
        if readings is None:
            self.devices.interrupted()
            self._last_part = self._frozen(jobs, now)
            return self._last_part
        if self.cgroups is not None:
            # A process's environment is the user's to forge: trust it only on nodes
            # where Slurm keeps no cgroups to go by.
            roots = self.cgroups.proc_roots()
            self.users.mapper.slurm_roots = roots
            self.users.mapper.environ_fallback = not roots
        self._last_part = self._attribute(jobs, readings, now)
        return self._last_part

    # -- attribution ---------------------------------------------------------

    def _attribute(self, jobs: list[Job], readings: list[DeviceReading], now: float
                   ) -> GpuPartResult:
        running = [j for j in jobs if j.running]
        key_to_job = {j.jobid: j for j in running}
        for job in running:  # Slurm 26.05: cgroup paths name jobs by SLUID
            if job.cgroup is not None and job.cgroup.is_sluid:
                key_to_job[job.cgroup.job_key] = job
        poll = _Poll(jobs, now, running, key_to_job, [], [], set(), set())
        for reading in readings:
            for error in reading.errors:
                self.errors.count("nvml", f"GPU {reading.index}: {error}")
            if reading.lost:
                self.errors.count("nvml", f"GPU {reading.index} ({reading.uuid}) is lost",
                                  log_it=False)
                self._hold_lost(reading, poll)
                poll.devices.append(self._device_sample(reading, None, None))
            else:
                self._attribute_gpu(reading, poll)
        present = {r.uuid for r in readings} | {m.uuid for r in readings for m in r.mig}
        self.devices.prune(present)
        self.energy.prune(present)
        self.counters.prune_gpus(present)
        self.activity.prune(present)
        self.link.xids.prune(present)
        self._forget(jobs, poll.seen_pids)
        return GpuPartResult(nvml_up=True,
                             job_gpus=job_gpu_samples(self.counters, jobs, poll.touched),
                             gpus=tuple(poll.devices), unattributed=tuple(poll.unattributed))

    def _attribute_gpu(self, reading: DeviceReading, poll: _Poll) -> None:
        """A whole GPU: busy time, energy, memory and processes to the jobs using or
        holding it; the rest to the users outside every job."""
        parent = GpuTarget(str(reading.index), reading.uuid, reading.minor)
        at = reading.clocks or HostClocks(realtime=poll.now)
        figures = self.devices.integrate(reading, at)
        window, busy = figures.window, figures.busy
        usage = self.users.usage(reading.processes, figures.process_samples,
                                 poll.key_to_job, poll.seen_pids)
        energy = self.energy.delta(reading, poll.now)
        if reading.mig:
            self._attribute_mig(reading, poll)
            # The parent keeps its device series (power, energy, temperature, ECC, Xid);
            # its processes are the instances' and are counted there.
            poll.devices.append(self._device_sample(
                reading, busy, (busy / window) if busy is not None and window else None))
            return
        trim = figures.clock if window and figures.before is not None else None
        holders = self.users.holders(parent, poll.running)
        busy_shares = shares(usage.weight, holders) if busy else {}
        self.energy.hold(parent.uuid, bool(holders))
        # The first reading after a restart covers the time the agent was down: only the
        # jobs that held the GPU across it take part.
        across = None if energy.gap_from is None else self.counters.held_across(
            [poll.key_to_job[j] for j in holders], parent.uuid, energy.gap_from)
        e_shares = energy_shares(busy_shares, busy or 0.0, holders, only=across)
        jobids = set(holders) | set(usage.processes) - {UNATTRIBUTED}
        for jobid in jobids:
            job = poll.key_to_job.get(jobid)
            if job is None:
                continue
            poll.touched.add((job.jobid, parent.uuid))
            c = self._counter(job, parent)
            job_window, job_busy = window or 0.0, busy
            if c.fresh and figures.before is None:
                # Idle time counted without samples, up to now: the part since its start.
                job_window = max(0.0, min(job_window, poll.now - (job.start_time or poll.now)))
            elif trim and c.fresh and job.start_time and reading.util_samples:
                # Only a job's first window can reach back before its start.
                start_us = wall_to_driver_us(job.start_time, trim, at)
                if start_us is not None:
                    job_window, job_busy = since_start(reading.util_samples, figures, start_us)
            if window and (figures.before is not None or job_window):
                c.fresh = False
            if jobid in holders:
                self._hold(c, job, poll.now, job_window)
            c.accrue(
                window=job_window,
                busy=None if job_busy is None else job_busy * busy_shares.get(jobid, 0.0),
                energy=None if energy.joules is None else energy.joules * e_shares.get(jobid, 0.0),
                memory=usage.memory.get(jobid, 0), processes=usage.processes.get(jobid, 0))
        self._count_activity(parent, reading.gpm, jobids, bool(usage.unattributed), poll)
        user_busy = self.counters.count_unattributed_busy(parent.uuid, usage, busy, busy_shares)
        for user, (n, mem) in sorted(usage.unattributed.items()):
            poll.unattributed.append(UnattributedSample(parent.gpu, parent.uuid, user, n, mem,
                                                        user_busy.get(user)))
        poll.devices.append(self._device_sample(
            reading, busy, (busy / window) if busy is not None and window else None,
            usage.unattributed))

    def _count_activity(self, target: GpuTarget, figures: GpmFigures | None, jobids: set[str],
                        outside: bool, poll: _Poll) -> None:
        """GPM figures to the target's totals and, where one job has it to itself, the job's."""
        self.activity.add(target.uuid, figures)
        job = poll.key_to_job.get(sole_job(jobids, outside) or "")
        if figures is not None and job is not None:
            self._counter(job, target).add_activity(job_activity(figures, job.start_time,
                                                                 poll.now))

    def _hold_lost(self, reading: DeviceReading, poll: _Poll) -> None:
        """A lost GPU is still allocated to its jobs: their allocated time goes on, their
        busy time cannot (nothing measures it), which is what a broken GPU costs them."""
        if not reading.uuid:
            return  # lost before it could be identified: nothing to match jobs against
        target = GpuTarget(str(reading.index), reading.uuid, reading.minor)
        holders = set(self.users.holders(target, poll.running))
        for job in poll.running:
            if job.jobid in holders:
                c = self._counter(job, target)
                poll.touched.add((job.jobid, target.uuid))
                self._hold(c, job, poll.now, 0.0)
                c.utilization, c.memory, c.processes = None, 0, 0

    def _attribute_mig(self, reading: DeviceReading, poll: _Poll) -> None:
        """MIG instances: allocation by MIG UUID, processes by GPU instance id; NVML gives no
        per-instance utilization, so busy time and energy are not attributed."""
        for inst in reading.mig:
            target = GpuTarget(f"{reading.index}.{inst.gpu_instance_id}", inst.uuid,
                               None, is_mig=True, parent_uuid=reading.uuid)
            procs = tuple(p for p in reading.processes
                          if p.gpu_instance_id == inst.gpu_instance_id)
            usage = self.users.usage(procs, (), poll.key_to_job, poll.seen_pids)
            holders = self.users.holders(target, poll.running)
            jobids = set(holders) | set(usage.processes) - {UNATTRIBUTED}
            for jobid in jobids:
                job = poll.key_to_job.get(jobid)
                if job is None:
                    continue
                poll.touched.add((job.jobid, target.uuid))
                c = self._counter(job, target)
                if jobid in holders:
                    self._hold(c, job, poll.now, 0.0)
                c.accrue(window=0.0, busy=None, energy=None, memory=usage.memory.get(jobid, 0),
                         processes=usage.processes.get(jobid, 0))
            self._count_activity(target, inst.gpm, jobids, bool(usage.unattributed), poll)
            for user, (n, mem) in sorted(usage.unattributed.items()):
                poll.unattributed.append(
                    UnattributedSample(target.gpu, target.uuid, user, n, mem))
            poll.devices.append(mig_sample(reading.uuid, target.gpu, inst, usage.unattributed,
                                           self.activity))

    def _hold(self, c: JobGpuCounters, job: Job, now: float, window: float) -> None:
        c.hold(now, job.start_time, self._first_poll or now, window)

    def _counter(self, job: Job, target: GpuTarget) -> JobGpuCounters:
        return self.counters.counter((job.jobid, job.start_time), target.uuid, target.gpu)

    def _forget(self, jobs: list[Job], seen_pids: set[int]) -> None:
        """Drop what belongs to jobs and processes no longer around."""
        tracked = {j.jobid for j in jobs}
        self.counters.forget_runs({(j.jobid, j.start_time) for j in jobs}, tracked)
        self.users.forget(tracked, seen_pids)

    # -- output -------------------------------------------------------------

    def _device_sample(self, reading: DeviceReading, busy: float | None,
                       utilization: float | None,
                       unattributed: dict[str, tuple[int, int]] | None = None) -> GpuSample:
        return device_sample(reading, busy, utilization, unattributed or {}, self.devices,
                             self.energy, self.link.xids.of(reading.uuid), self.activity)

    def _frozen(self, jobs: list[Job], now: float) -> GpuPartResult:
        """The last figures (NVML down or stuck): only the time held goes on."""
        for job in jobs:
            if job.running:
                for c in (self.counters.of_run((job.jobid, job.start_time)) or {}).values():
                    if c.held_until is not None:
                        self._hold(c, job, now, 0.0)
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
                **self.counters.export_state(), **self.activity.export_state()}

    def import_state(self, data: dict[str, Any]) -> None:
        by_gpu, driver = of_this_boot(data.get("sample_cursors"), self.boot_id)
        self.devices.import_state(data, by_gpu, driver)
        self.energy.import_state(data, self.boot_id)
        self.counters.import_state(data)
        self.activity.import_state(data)


def job_gpu_samples(counters: CounterStore, jobs: list[Job],
                    touched: set[tuple[str, str]] | None) -> tuple[JobGpuSample, ...]:
    """Every job run's GPU series; gauges only where ``touched`` (None: none live)."""
    out = []
    for job in jobs:
        per_run = counters.of_run((job.jobid, job.start_time)) or {}
        for uuid, c in sorted(per_run.items(), key=lambda item: item[1].gpu):
            live = job.running and (touched is None or (job.jobid, uuid) in touched)
            out.append(JobGpuSample(
                jobid=job.jobid, user=job.user, gpu=c.gpu, uuid=uuid,
                allocated_seconds=c.allocated, busy_seconds=c.busy,
                utilization=c.utilization if live else None,
                memory_used_bytes=c.memory if live else 0,
                memory_peak_bytes=c.peak, energy_joules=c.energy,
                processes=c.processes if live else 0,
                activity_seconds=tuple(sorted(c.activity.items())),
            ))
    return tuple(out)


def device_sample(reading: DeviceReading, busy: float | None, utilization: float | None,
                  unattributed: dict[str, tuple[int, int]], devices: DeviceIntegrator,
                  energy: EnergyCounters, xid_errors: tuple[tuple[int, int], ...],
                  activity: DeviceActivity) -> GpuSample:
    """A physical GPU's series: this poll's reading with the totals kept for it."""
    energy_mj = energy.exported_mj(reading)
    seconds, traffic = activity.of(reading.uuid)
    return GpuSample(
        gpu=str(reading.index), uuid=reading.uuid, name=reading.name, minor=reading.minor,
        pci_bus_id=reading.pci_bus_id, lost=reading.lost,
        utilization=utilization,
        busy_seconds=devices.device_busy.get(reading.uuid) if busy is not None else None,
        memory_used_bytes=reading.memory_used, memory_total_bytes=reading.memory_total,
        power_watts=reading.power_watts,
        energy_joules=energy_mj / 1000.0 if energy_mj is not None else None,
        temperature_celsius=reading.temperature_c,
        ecc_corrected=reading.ecc_corrected, ecc_uncorrected=reading.ecc_uncorrected,
        xid_errors=xid_errors, clamped_samples=devices.clamped.get(reading.uuid),
        unattributed_processes=sum(n for n, _ in unattributed.values()),
        unattributed_memory_bytes=sum(m for _, m in unattributed.values()),
        activity_seconds=seconds, traffic_bytes=traffic,
    )


def mig_sample(parent_uuid: str, gpu: str, inst: MigInstance,
               unattributed: dict[str, tuple[int, int]], activity: DeviceActivity) -> GpuSample:
    """A MIG instance's series: its memory, the processes outside every job, its GPM totals."""
    seconds, traffic = activity.of(inst.uuid)
    return GpuSample(
        gpu=gpu, uuid=inst.uuid, name=inst.name, minor=None, pci_bus_id="",
        parent_uuid=parent_uuid, memory_used_bytes=inst.memory_used,
        memory_total_bytes=inst.memory_total,
        unattributed_processes=sum(n for n, _ in unattributed.values()),
        unattributed_memory_bytes=sum(m for _, m in unattributed.values()),
        activity_seconds=seconds, traffic_bytes=traffic,
    )
