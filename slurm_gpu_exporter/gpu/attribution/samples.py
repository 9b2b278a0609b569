"""The GPU side's snapshot series: per job run and GPU, per device, per MIG instance."""

from __future__ import annotations

from typing import Any

from slurm_gpu_exporter.exposition.snapshot import GpuSample, JobGpuSample
from slurm_gpu_exporter.gpu.attribution.activity import DeviceActivity
from slurm_gpu_exporter.gpu.attribution.counters import CounterStore
from slurm_gpu_exporter.gpu.attribution.energy import EnergyCounters
from slurm_gpu_exporter.gpu.attribution.job_errors import HealthBook
from slurm_gpu_exporter.gpu.driver.integration import DeviceIntegrator
from slurm_gpu_exporter.gpu.readings import DeviceReading, MigInstance
from slurm_gpu_exporter.jobs.job import Job


def job_gpu_samples(counters: CounterStore, jobs: list[Job],
                    touched: set[tuple[str, str]] | None) -> tuple[JobGpuSample, ...]:
    """Every job run's GPU series; gauges only where ``touched`` (None: none live)."""
    out = []
    for job in jobs:
        per_run = counters.of_run((job.jobid, job.start_time)) or {}
        for uuid, c in sorted(per_run.items(), key=lambda item: item[1].gpu):
            live = job.running and (touched is None or (job.jobid, uuid) in touched)
            out.append(JobGpuSample(
                job=job.info(), gpu=c.gpu, uuid=uuid,
                allocated_seconds=c.allocated, busy_seconds=c.busy,
                unknown_seconds=c.unknown if c.busy is not None else None,
                utilization=c.utilization if live else None,
                memory_used_bytes=c.memory if live else 0,
                memory_peak_bytes=c.peak, energy_joules=c.energy,
                processes=c.processes if live else 0,
                activity_seconds=tuple(sorted(c.activity.items())),
                health=tuple(sorted(c.health.items())),
                xid_last_seen=tuple(sorted((int(x), t) for x, t in c.xid_last.items())),
            ))
    return tuple(out)


def device_sample(reading: DeviceReading, busy: float | None, utilization: float | None,
                  unattributed: dict[str, tuple[int, int]], devices: DeviceIntegrator,
                  energy: EnergyCounters, xid_errors: tuple[tuple[int, int], ...],
                  activity: DeviceActivity, health: HealthBook | None = None) -> GpuSample:
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
        xid_errors=xid_errors,
        unknown_seconds=devices.device_unknown.get(reading.uuid, 0.0) if busy is not None
        else None,
        driver_events=tuple(sorted(devices.events.counts.get(reading.uuid, {}).items())),
        unattributed_processes=sum(n for n, _ in unattributed.values()),
        unattributed_memory_bytes=sum(m for _, m in unattributed.values()),
        activity_seconds=seconds, traffic_bytes=traffic,
        **(_device_health(reading, health) if health is not None else {}),
    )


def _device_health(reading: DeviceReading, health: HealthBook) -> dict[str, Any]:
    """GpuSample's throttling, clock and error-counter fields of a physical GPU."""
    h = reading.health
    return {
        "throttled_seconds": health.throttle.device_seconds(reading.uuid),
        "sm_clock_hz": None if h is None or h.sm_clock_mhz is None else h.sm_clock_mhz * 1e6,
        "sm_clock_max_hz": None if h is None or h.sm_clock_max_mhz is None
        else h.sm_clock_max_mhz * 1e6,
        "error_counters": tuple(sorted(health.device_counters(reading.uuid).items())),
    }


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
