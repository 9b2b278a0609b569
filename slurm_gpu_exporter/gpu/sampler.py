"""The GPU sampler: polls the backend, integrates busy time and energy, attributes them to jobs.

Busy time comes from the driver's own sample buffer: every sample newer than the
last one seen is integrated once, so a job's mean utilization is exact whatever
the scrape or sample interval. Per job run (job id and start time) and GPU,
allocated seconds, busy seconds and energy are counters that start at 0 with the
job and are saved in the state dir, so a restart of the agent never lowers them.
Allocated time is wall-clock time held; busy time and energy come from the
driver, and a read that fails once leaves them where they were (the driver's
counters are cumulative, so the next good read counts what was missed).

NVML runs in a worker thread: a call that hangs freezes the GPU figures (and
shows as ``slurm_gpu_exporter_nvml_up 0``) but never the job metrics or a scrape.
Xid events are read in a thread of their own.
"""

from __future__ import annotations

import itertools
import logging
import pwd
import statistics
import threading
import time
from collections.abc import Iterable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from slurm_gpu_exporter.allocation import GpuAllocation, gpu_allocation
from slurm_gpu_exporter.attribution import (
    UNATTRIBUTED,
    GpuTarget,
    energy_shares,
    held_targets,
    shares,
    user_shares,
)
from slurm_gpu_exporter.cgroups import CgroupFS
from slurm_gpu_exporter.errors import SourceErrors
from slurm_gpu_exporter.gpu.backend import (
    DeviceReading,
    GpuBackend,
    GpuProcess,
    GpuUnavailable,
    ProcessUtilSample,
    UtilSample,
)
from slurm_gpu_exporter.gpu.counters import (
    CLOCK_TOLERANCE_S,
    JobGpuCounters,
    JobKey,
    clock_offset_s,
    load_job_counters,
    save_job_counters,
)
from slurm_gpu_exporter.procfs import PidJobMapper, ProcessGone, read_uid
from slurm_gpu_exporter.registry import Job
from slurm_gpu_exporter.snapshot import GpuSample, JobGpuSample, UnattributedSample

log = logging.getLogger(__name__)

# Gaps between driver samples longer than this are not integrated (samples were
# lost, e.g. the agent was down longer than the driver's buffer reaches back).
MIN_MAX_GAP_S = 2.0


@dataclass(frozen=True)
class GpuPartResult:
    """What the GPU sampler adds to a snapshot."""

    nvml_up: bool
    job_gpus: tuple[JobGpuSample, ...] = ()
    gpus: tuple[GpuSample, ...] = ()
    unattributed: tuple[UnattributedSample, ...] = ()


@dataclass
class _Usage:
    """One target's users in one poll: processes and SM weights by job key."""

    memory: dict[str, int] = field(default_factory=dict)
    processes: dict[str, int] = field(default_factory=dict)
    weight: dict[str, float] = field(default_factory=dict)
    unattributed: dict[str, tuple[int, int]] = field(default_factory=dict)  # user -> (n, bytes)
    unattributed_weight: dict[str, float] = field(default_factory=dict)  # user -> SM weight


class _Poller:
    """Runs backend reads in a worker thread so that a hung call cannot stall sampling.

    Each read gets a daemon thread of its own: a call that never returns must not keep
    the agent from exiting (a thread pool's workers are joined at exit).
    """

    def __init__(self, backend: GpuBackend) -> None:
        self._backend = backend
        self._pending: Future[list[DeviceReading]] | None = None
        self._since = 0.0

    def _start(self, cursors: dict[str, tuple[int, int]]) -> Future[list[DeviceReading]]:
        future: Future[list[DeviceReading]] = Future()

        def run() -> None:
            try:
                future.set_result(self._backend.read(cursors))
            except BaseException as exc:
                future.set_exception(exc)

        threading.Thread(target=run, name="nvml-read", daemon=True).start()
        return future

    def poll(self, cursors: dict[str, tuple[int, int]], timeout: float
             ) -> list[DeviceReading] | None:
        """The readings, or None while a read is still running (stuck).

        A read that was already stuck at the previous poll is not waited for again,
        so a hung NVML call costs the sampler one timeout, not one per sample.
        """
        if self._pending is None:
            self._pending = self._start(dict(cursors))
            self._since = time.monotonic()
            wait = timeout
        else:
            wait = 0.0
        try:
            result = self._pending.result(wait)
        except TimeoutError:
            return None
        finally:
            if self._pending.done():
                self._pending = None
        return result

    @property
    def busy(self) -> bool:
        """True while a read is in flight (NVML must not be shut down under it)."""
        return self._pending is not None

    @property
    def stuck_for(self) -> float:
        return time.monotonic() - self._since if self._pending is not None else 0.0


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
    ) -> None:
        self.backend = backend
        self.errors = errors
        self.cgroups = cgroups
        self.proc_root = proc_root
        self.poll_timeout = poll_timeout
        self.reinit_after = reinit_after
        self.mapper = PidJobMapper(proc_root)
        self._poller: _Poller | None = None
        self._initialised = False
        self._next_init = 0.0
        self._init_error_logged = False
        self._first_poll: float | None = None  # wall time of the first sample
        self._cursors: dict[str, tuple[int, int]] = {}
        self._last_energy: dict[str, int] = {}
        self._device_busy: dict[str, float] = {}
        self._unattributed_busy: dict[tuple[str, str], float] = {}  # (uuid, user) -> s
        self._clock_warned: set[str] = set()
        self._counters: dict[JobKey, dict[str, JobGpuCounters]] = {}  # job run -> uuid -> counters
        self._users: dict[int, str] = {}
        self._allocations: dict[str, tuple[tuple[str, str], GpuAllocation]] = {}
        self._xid_lock = threading.Lock()
        self._xid_counts: dict[tuple[str, int], int] = {}
        self._stop = threading.Event()
        self._xid_thread: threading.Thread | None = None
        self._last_part = GpuPartResult(nvml_up=False)

    # -- life cycle ---------------------------------------------------------

    def _ensure_init(self) -> bool:
        if self._initialised:
            return True
        now = time.monotonic()
        if now < self._next_init:
            return False
        self._next_init = now + self.reinit_after
        try:
            driver = self.backend.init()
        except GpuUnavailable as exc:
            if not self._init_error_logged:
                log.warning("%s. GPU metrics are off (slurm_gpu_exporter_nvml_up 0); job "
                            "metrics are still served. Retrying every %.0f s.", exc,
                            self.reinit_after)
                self._init_error_logged = True
            self.errors.count("nvml", str(exc), log_it=False)
            return False
        log.info("GPU backend ready (driver %s)", driver)
        self._initialised = True
        self._init_error_logged = False
        self._poller = _Poller(self.backend)
        self._stop = threading.Event()
        self._xid_thread = threading.Thread(target=self._watch_xid, args=(self._stop,),
                                            name="xid-events", daemon=True)
        self._xid_thread.start()
        return True

    def close(self) -> None:
        """Stop the worker threads and release the backend.

        A read still hung inside NVML is left alone (its thread is a daemon): shutting
        NVML down under a call in flight is not safe on a real driver.
        """
        self._stop.set()
        in_flight = self._poller is not None and self._poller.busy
        self._poller = None
        if self._xid_thread is not None:
            self._xid_thread.join(3)
            self._xid_thread = None
        if self._initialised:
            self._initialised = False
            if in_flight:
                log.warning("an NVML call is still hung; exiting without NVML shutdown")
                return
            try:
                self.backend.shutdown()
            except Exception as exc:  # already broken: nothing more to release
                log.debug("GPU backend shutdown: %s", exc)

    def _watch_xid(self, stop: threading.Event) -> None:
        backoff = 1.0
        while not stop.is_set():
            try:
                events = self.backend.wait_xid(1000)
                backoff = 1.0
            except Exception as exc:  # a lost GPU makes the wait fail at once: back off
                log.debug("Xid event wait failed: %s", exc)
                stop.wait(backoff)
                backoff = min(backoff * 2, 30.0)
                continue
            if events:
                with self._xid_lock:
                    for event in events:
                        key = (event.uuid, event.xid)
                        self._xid_counts[key] = self._xid_counts.get(key, 0) + 1
                for event in events:
                    log.warning("Xid %d on GPU %s", event.xid, event.uuid)

    # -- sampling -----------------------------------------------------------

    def sample(self, jobs: list[Job], now: float) -> GpuPartResult:
        if self._first_poll is None:
            self._first_poll = now
        if not self._ensure_init():
            self._last_part = self._frozen(jobs, now)
            return self._last_part
        assert self._poller is not None
        try:
            readings = self._poller.poll(self._cursors, self.poll_timeout)
        except Exception as exc:  # the driver went away under us: start over later
            self.errors.count("nvml", f"reading the GPUs failed ({exc}); re-initialising in "
                              f"{self.reinit_after:.0f} s")
            self.close()
            self._next_init = time.monotonic() + self.reinit_after
            self._last_part = self._frozen(jobs, now)
            return self._last_part
        if readings is None:
            log.debug("NVML read stuck for %.0f s", self._poller.stuck_for)
            self.errors.count("nvml", "an NVML call has not returned (hung driver?); GPU "
                              "figures are frozen until it does")
            self._last_part = self._frozen(jobs, now)
            return self._last_part
        if self.cgroups is not None:
            # A process's environment is the user's to forge: trust it only on nodes
            # where Slurm keeps no cgroups to go by.
            self.mapper.environ_fallback = not self.cgroups.slurm_roots()
        self._last_part = self._attribute(jobs, readings, now)
        return self._last_part

    def _attribute(self, jobs: list[Job], readings: list[DeviceReading], now: float
                   ) -> GpuPartResult:
        running = [j for j in jobs if j.running]
        key_to_job = {j.jobid: j for j in running}
        for job in running:  # Slurm 26.05: cgroup paths name jobs by SLUID
            if job.cgroup is not None and job.cgroup.is_sluid:
                key_to_job[job.cgroup.job_key] = job
        devices: list[GpuSample] = []
        unattributed: list[UnattributedSample] = []
        seen_pids: set[int] = set()
        touched: set[tuple[str, str]] = set()
        for reading in readings:
            for error in reading.errors:
                self.errors.count("nvml", f"GPU {reading.index}: {error}")
            if reading.lost:
                self.errors.count("nvml", f"GPU {reading.index} ({reading.uuid}) is lost",
                                  log_it=False)
                self._hold_lost(reading, running, now, touched)
                devices.append(self._device_sample(reading, None, None))
                continue
            parent = GpuTarget(str(reading.index), reading.uuid, reading.minor)
            usage = self._usage(reading.processes, reading.process_samples or (), key_to_job,
                                seen_pids)
            cursor = self._cursors.get(reading.uuid, (0, 0))[0]
            window, busy = self._integrate(reading)
            energy = self._energy_delta(reading)
            if reading.mig:
                self._attribute_mig(reading, running, key_to_job, now, devices,
                                    unattributed, seen_pids, touched)
                continue
            trim = cursor if window and self._driver_clock_ok(reading, now) else 0
            holders = self._holders(parent, running)
            busy_shares = shares(usage.weight, holders) if busy else {}
            e_shares = energy_shares(busy_shares, busy or 0.0, holders)
            for jobid in set(holders) | set(usage.processes) - {UNATTRIBUTED}:
                job = key_to_job.get(jobid)
                if job is None:
                    continue
                touched.add((job.jobid, parent.uuid))
                c = self._counter(job, parent)
                job_window, job_busy = window or 0.0, busy
                if trim and c.fresh and job.start_time and reading.util_samples:
                    # Only a job's first window can reach back before its start.
                    job_window, job_busy = integrate_samples(
                        reading.util_samples, trim, not_before_us=int(job.start_time * 1e6))
                if window:
                    c.fresh = False
                if jobid in holders:
                    self._hold(c, job, now, job_window)
                c.accrue(
                    window=job_window,
                    busy=None if job_busy is None else job_busy * busy_shares.get(jobid, 0.0),
                    energy=None if energy is None else energy * e_shares.get(jobid, 0.0),
                    memory=usage.memory.get(jobid, 0), processes=usage.processes.get(jobid, 0))
            user_busy = self._count_unattributed_busy(parent.uuid, usage, busy, busy_shares)
            for user, (n, mem) in sorted(usage.unattributed.items()):
                unattributed.append(UnattributedSample(parent.gpu, parent.uuid, user, n, mem,
                                                       user_busy.get(user)))
            devices.append(self._device_sample(
                reading, busy, (busy / window) if busy is not None and window else None,
                usage.unattributed))
        self._prune_gpus({r.uuid for r in readings} | {m.uuid for r in readings for m in r.mig})
        self._forget(jobs, seen_pids)
        return GpuPartResult(
            nvml_up=True,
            job_gpus=self._job_gpu_samples(jobs, touched),
            gpus=tuple(devices),
            unattributed=tuple(unattributed),
        )

    def _count_unattributed_busy(self, uuid: str, usage: _Usage, busy: float | None,
                                 busy_shares: dict[str, float]) -> dict[str, float]:
        """Busy totals of the users with processes outside every job on this GPU."""
        if busy is None:
            return {}
        outside = busy * busy_shares.get(UNATTRIBUTED, 0.0)
        for user, share in user_shares(usage.unattributed_weight, usage.unattributed).items():
            key = (uuid, user)
            self._unattributed_busy[key] = self._unattributed_busy.get(key, 0.0) + outside * share
        return {user: self._unattributed_busy.get((uuid, user), 0.0)
                for user in usage.unattributed}

    def _driver_clock_ok(self, reading: DeviceReading, now: float) -> bool:
        """False (logged once per GPU) when the driver stamps samples on another clock."""
        offset = clock_offset_s(reading.util_samples or (), now)
        if abs(offset) <= CLOCK_TOLERANCE_S:
            return True
        if reading.uuid not in self._clock_warned:
            self._clock_warned.add(reading.uuid)
            log.warning("GPU %d (%s): driver sample timestamps are %.0f s off the wall clock; "
                        "busy time is still counted, but a job's first window is not trimmed "
                        "to its start", reading.index, reading.uuid, offset)
        return False

    def _holders(self, target: GpuTarget, running: list[Job]) -> list[str]:
        """Ids of the running jobs whose allocation covers the target."""
        return [j.jobid for j in running if held_targets(self._allocation(j), [target])]

    def _allocation(self, job: Job) -> GpuAllocation:
        """A job's GPUs, parsed once per job rather than once per GPU and sample."""
        key = (job.job_gpus, job.cuda_visible_devices)
        cached = self._allocations.get(job.jobid)
        if cached is None or cached[0] != key:
            cached = self._allocations[job.jobid] = (key, gpu_allocation(*key))
        return cached[1]

    def _hold_lost(self, reading: DeviceReading, running: list[Job], now: float,
                   touched: set[tuple[str, str]]) -> None:
        """A lost GPU is still allocated to its jobs: their allocated time goes on, their
        busy time cannot (nothing measures it), which is what a broken GPU costs them."""
        if not reading.uuid:
            return  # lost before it could be identified: nothing to match jobs against
        target = GpuTarget(str(reading.index), reading.uuid, reading.minor)
        holders = set(self._holders(target, running))
        for job in running:
            if job.jobid in holders:
                c = self._counter(job, target)
                touched.add((job.jobid, target.uuid))
                self._hold(c, job, now, 0.0)
                c.utilization, c.memory, c.processes = None, 0, 0

    def _attribute_mig(self, reading: DeviceReading, running: list[Job],
                       key_to_job: dict[str, Job], now: float,
                       devices: list[GpuSample], unattributed: list[UnattributedSample],
                       seen_pids: set[int], touched: set[tuple[str, str]]) -> None:
        """MIG instances: allocation by MIG UUID, processes by GPU instance id; NVML gives no
        per-instance utilization, so busy time and energy are not attributed."""
        for inst in reading.mig:
            target = GpuTarget(f"{reading.index}.{inst.gpu_instance_id}", inst.uuid,
                               None, is_mig=True, parent_uuid=reading.uuid)
            procs = tuple(p for p in reading.processes
                          if p.gpu_instance_id == inst.gpu_instance_id)
            usage = self._usage(procs, (), key_to_job, seen_pids)
            holders = self._holders(target, running)
            for jobid in set(holders) | set(usage.processes) - {UNATTRIBUTED}:
                job = key_to_job.get(jobid)
                if job is None:
                    continue
                touched.add((job.jobid, target.uuid))
                c = self._counter(job, target)
                if jobid in holders:
                    self._hold(c, job, now, 0.0)
                c.accrue(window=0.0, busy=None, energy=None, memory=usage.memory.get(jobid, 0),
                         processes=usage.processes.get(jobid, 0))
            for user, (n, mem) in sorted(usage.unattributed.items()):
                unattributed.append(UnattributedSample(target.gpu, target.uuid, user, n, mem))
            devices.append(GpuSample(
                gpu=target.gpu, uuid=inst.uuid, name=inst.name, minor=None, pci_bus_id="",
                parent_uuid=reading.uuid, memory_used_bytes=inst.memory_used,
                memory_total_bytes=inst.memory_total,
                unattributed_processes=sum(n for n, _ in usage.unattributed.values()),
                unattributed_memory_bytes=sum(m for _, m in usage.unattributed.values()),
            ))

    def _hold(self, c: JobGpuCounters, job: Job, now: float, window: float) -> None:
        c.hold(now, job.start_time, self._first_poll or now, window)

    def _usage(self, processes: Iterable[GpuProcess],
               process_samples: Iterable[ProcessUtilSample], key_to_job: dict[str, Job],
               seen_pids: set[int]) -> _Usage:
        """Who uses the GPU: processes, memory and SM weights by job (or user, outside jobs)."""
        usage = _Usage()
        weights: dict[int, float] = {}
        for sample in process_samples:
            weights[sample.pid] = weights.get(sample.pid, 0.0) + sample.sm_percent
        for proc in processes:
            seen_pids.add(proc.pid)
            pid_job = self.mapper.job_of(proc.pid)
            job = key_to_job.get(pid_job.job_key) if pid_job is not None else None
            memory = proc.used_memory or 0
            if job is None:
                user = self._user_of(proc.pid)
                if user is None:
                    continue  # exited between NVML's list and our look
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

    def _user_of(self, pid: int) -> str | None:
        if pid in self._users:
            return self._users[pid]
        try:
            uid = read_uid(self.proc_root, pid)
        except (ProcessGone, ValueError, OSError):
            return None
        try:
            name = pwd.getpwuid(uid).pw_name
        except KeyError:
            name = str(uid)
        self._users[pid] = name
        return name

    # -- integration --------------------------------------------------------

    def _integrate(self, reading: DeviceReading) -> tuple[float | None, float | None]:
        """(window seconds, busy seconds) covered by the new driver samples, or (None, None)."""
        uuid = reading.uuid
        dev_cursor, proc_cursor = self._cursors.get(uuid, (0, 0))
        if reading.process_samples:
            proc_cursor = max(proc_cursor, max(s.timestamp_us for s in reading.process_samples))
        samples = reading.util_samples
        if samples is None:
            self._cursors[uuid] = (dev_cursor, proc_cursor)
            return None, None
        if not samples or not dev_cursor:
            # Nothing new, or the first look: the buffer's history is not this job's.
            last = samples[-1].timestamp_us if samples else dev_cursor
            self._cursors[uuid] = (last, proc_cursor)
            return 0.0, 0.0
        window, busy = integrate_samples(samples, dev_cursor)
        self._cursors[uuid] = (samples[-1].timestamp_us, proc_cursor)
        self._device_busy[uuid] = self._device_busy.get(uuid, 0.0) + busy
        return window, busy

    def _energy_delta(self, reading: DeviceReading) -> float | None:
        """Joules since the previous reading; None where the GPU has no energy counter.

        A read that failed counts 0 now: the last good value is kept, so the next good
        read counts the energy used in between (the driver's counter is cumulative).
        """
        if reading.energy_mj is None:
            return 0.0 if "energy" in reading.failed else None
        last = self._last_energy.get(reading.uuid)
        self._last_energy[reading.uuid] = reading.energy_mj
        if last is None or reading.energy_mj < last:  # first look, or the driver reloaded
            return 0.0
        return (reading.energy_mj - last) / 1000.0

    def _job_counters(self, job: Job) -> dict[str, JobGpuCounters] | None:
        key = (job.jobid, job.start_time)
        per_job = self._counters.get(key)
        if per_job is None and (job.jobid, None) in self._counters:
            # Saved by an agent that keyed counters by job id alone: this job's.
            per_job = self._counters[key] = self._counters.pop((job.jobid, None))
        return per_job

    def _counter(self, job: Job, target: GpuTarget) -> JobGpuCounters:
        per_job = self._job_counters(job)
        if per_job is None:
            per_job = self._counters[(job.jobid, job.start_time)] = {}
        counter = per_job.get(target.uuid)
        if counter is None:
            counter = per_job[target.uuid] = JobGpuCounters(gpu=target.gpu)
        return counter

    # -- output -------------------------------------------------------------

    def _device_sample(self, reading: DeviceReading, busy: float | None,
                       utilization: float | None,
                       unattributed: dict[str, tuple[int, int]] | None = None) -> GpuSample:
        with self._xid_lock:
            xids = tuple(sorted((x, n) for (u, x), n in self._xid_counts.items()
                                if u == reading.uuid))
        unattributed = unattributed or {}
        energy_mj = reading.energy_mj
        if energy_mj is None and "energy" in reading.failed:
            energy_mj = self._last_energy.get(reading.uuid)  # a failed read: the last good one
        return GpuSample(
            gpu=str(reading.index), uuid=reading.uuid, name=reading.name, minor=reading.minor,
            pci_bus_id=reading.pci_bus_id, lost=reading.lost,
            utilization=utilization,
            busy_seconds=self._device_busy.get(reading.uuid) if busy is not None else None,
            memory_used_bytes=reading.memory_used, memory_total_bytes=reading.memory_total,
            power_watts=reading.power_watts,
            energy_joules=energy_mj / 1000.0 if energy_mj is not None else None,
            temperature_celsius=reading.temperature_c,
            ecc_corrected=reading.ecc_corrected, ecc_uncorrected=reading.ecc_uncorrected,
            xid_errors=xids,
            unattributed_processes=sum(n for n, _ in unattributed.values()),
            unattributed_memory_bytes=sum(m for _, m in unattributed.values()),
        )

    def _job_gpu_samples(self, jobs: list[Job], touched: set[tuple[str, str]] | None
                         ) -> tuple[JobGpuSample, ...]:
        out = []
        for job in jobs:
            for uuid, c in sorted((self._job_counters(job) or {}).items(),
                                  key=lambda item: item[1].gpu):
                live = job.running and (touched is None or (job.jobid, uuid) in touched)
                out.append(JobGpuSample(
                    jobid=job.jobid, user=job.user, gpu=c.gpu, uuid=uuid,
                    allocated_seconds=c.allocated, busy_seconds=c.busy,
                    utilization=c.utilization if live else None,
                    memory_used_bytes=c.memory if live else 0,
                    memory_peak_bytes=c.peak, energy_joules=c.energy,
                    processes=c.processes if live else 0,
                ))
        return tuple(out)

    def _frozen(self, jobs: list[Job], now: float) -> GpuPartResult:
        """The last figures (NVML down or stuck): only the time held goes on."""
        for job in jobs:
            if job.running:
                for c in (self._job_counters(job) or {}).values():
                    if c.held_until is not None:
                        self._hold(c, job, now, 0.0)
        return GpuPartResult(nvml_up=False,
                             job_gpus=self._job_gpu_samples(jobs, touched=None),
                             gpus=self._last_part.gpus,
                             unattributed=self._last_part.unattributed)

    def _forget(self, jobs: Iterable[Job], seen_pids: set[int]) -> None:
        """Drop what belongs to jobs and processes no longer around."""
        jobs = list(jobs)
        runs = {(j.jobid, j.start_time) for j in jobs}
        tracked = {j.jobid for j in jobs}
        for key in [k for k in self._counters
                    if k not in runs and not (k[1] is None and k[0] in tracked)]:
            del self._counters[key]
        for jobid in [j for j in self._allocations if j not in tracked]:
            del self._allocations[jobid]
        for pid in [p for p in self._users if p not in seen_pids]:
            del self._users[pid]

    def _prune_gpus(self, present: set[str]) -> None:
        """Drop what is kept per GPU or MIG UUID for those no longer present (a MIG
        layout changed, a GPU was removed), so the caches do not grow for ever."""
        for cache in (self._cursors, self._last_energy, self._device_busy):
            for uuid in [u for u in cache if u not in present]:
                del cache[uuid]
        for key in [k for k in self._unattributed_busy if k[0] not in present]:
            del self._unattributed_busy[key]
        self._clock_warned &= present
        with self._xid_lock:
            for key in [k for k in self._xid_counts if k[0] not in present]:
                del self._xid_counts[key]

    # -- state dir ----------------------------------------------------------

    def export_state(self) -> dict[str, Any]:
        return {
            "cursors": {uuid: list(c) for uuid, c in self._cursors.items()},
            "device_busy": dict(self._device_busy),
            "job_counters": save_job_counters(self._counters),
            "unattributed_busy": [[uuid, user, v]
                                  for (uuid, user), v in self._unattributed_busy.items()],
        }

    def import_state(self, data: dict[str, Any]) -> None:
        for uuid, cursor in (data.get("cursors") or {}).items():
            if isinstance(cursor, list) and len(cursor) == 2:
                self._cursors[uuid] = (int(cursor[0]), int(cursor[1]))
        for uuid, busy in (data.get("device_busy") or {}).items():
            if isinstance(busy, int | float):
                self._device_busy[uuid] = float(busy)
        for key, per in load_job_counters(data).items():
            self._counters.setdefault(key, {}).update(per)
        rows = data.get("unattributed_busy")
        for row in rows if isinstance(rows, list) else ():
            if (isinstance(row, list) and len(row) == 3 and isinstance(row[2], int | float)):
                self._unattributed_busy[(str(row[0]), str(row[1]))] = float(row[2])


def integrate_samples(samples: tuple[UtilSample, ...], cursor_us: int | None,
                      not_before_us: int = 0) -> tuple[float, float]:
    """(window, busy) seconds from driver samples, each covering the time since the one before.

    With no cursor (first look) the first sample only starts the window. A gap
    longer than a few sample periods (lost samples) is left out of both window
    and busy time, so busy / window stays the true mean of what was observed.
    Time before ``not_before_us`` (a job's start) is left out too.
    """
    stamps = [s.timestamp_us for s in samples]
    spacings = [b - a for a, b in itertools.pairwise(stamps) if b > a]
    period_s = statistics.median(spacings) / 1e6 if spacings else 0.0
    max_gap = max(MIN_MAX_GAP_S, 3 * period_s)
    window = busy = 0.0
    previous = cursor_us
    for sample in samples:
        if previous is not None and 0 < (sample.timestamp_us - previous) / 1e6 <= max_gap:
            dt = (sample.timestamp_us - max(previous, not_before_us)) / 1e6
            if dt > 0:
                window += dt
                busy += dt * min(max(sample.percent, 0.0), 100.0) / 100.0
        previous = sample.timestamp_us
    return window, busy
