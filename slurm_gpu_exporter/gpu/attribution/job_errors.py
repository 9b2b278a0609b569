"""Errors that hit a job's GPU while the job held it: Xid events, volatile ECC errors,
remapped rows, PCIe replays and NVLink errors, as per-job counters.

Device counters are cumulative: each interval's delta (gpu/attribution/cumulative.py, kept in the
state dir across restarts) goes to every job holding the GPU or one of its MIG
instances at the poll that reads it. Xid events come from the Xid thread with the
wall time they were seen (gpu/xids.XidCounts): an event goes to the jobs holding
the GPU at the next poll that started before it, so a job that comes after an event
never gets it. Throttled time (gpu/attribution/throttle.py) is handed out the same way.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from slurm_gpu_exporter.gpu.attribution.counters import JobGpuCounters
from slurm_gpu_exporter.gpu.attribution.cumulative import CumulativeReadings
from slurm_gpu_exporter.gpu.attribution.throttle import ThrottleBook
from slurm_gpu_exporter.gpu.readings import DeviceReading
from slurm_gpu_exporter.gpu.xids import XidCounts
from slurm_gpu_exporter.jobs.job import Job


@dataclass(frozen=True)
class HealthDelta:
    """One interval of one GPU: throttled seconds by reason, device error counts by key
    ("ecc:corrected", "remapped_rows:correctable", "pcie_replays", "nvlink:crc_flit"),
    Xid events (code, wall time). ``gap_from``: this interval began before a restart of
    the agent (gpu/cumulative.Delta), only jobs that held the GPU since then get it."""

    throttled: Mapping[str, float]
    errors: Mapping[str, int]
    xids: tuple[tuple[int, float], ...] = ()
    gap_from: float | None = None

    def give(self, c: JobGpuCounters, job: Job, counted: bool = True) -> None:
        """Add this interval to a job's counters on the GPU; ``counted`` False (a job that
        did not hold it across a restart's gap): only its series start, at 0."""
        for reason, seconds in self.throttled.items():
            c.add_health(f"throttle:{reason}", seconds if counted else 0.0)
        for key, n in self.errors.items():
            c.add_health(key, n if counted else 0)
        start = job.start_time or 0.0
        for xid, at in self.xids:
            if at >= start:
                c.add_health(f"xid:{xid}", 1)
                c.xid_last[str(xid)] = max(at, c.xid_last.get(str(xid), 0.0))


def _error_counters(reading: DeviceReading) -> dict[str, int]:
    out = dict(reading.health.counters) if reading.health is not None else {}
    if reading.ecc_corrected is not None:
        out["ecc:corrected"] = reading.ecc_corrected
    if reading.ecc_uncorrected is not None:
        out["ecc:uncorrected"] = reading.ecc_uncorrected
    return out


class HealthBook:
    """Per GPU: the last throttle and error readings, and the Xid events not given yet."""

    def __init__(self, xids: XidCounts) -> None:
        self.throttle = ThrottleBook()
        self.errors = CumulativeReadings("error_readings", "GPU error counters")
        self.xids = xids

    def interval(self, reading: DeviceReading, now: float) -> HealthDelta:
        """What slowed or hit the GPU since its previous reading."""
        throttled = self.throttle.interval(reading, now)
        errors = self.errors.delta(reading.uuid, _error_counters(reading), now)
        gaps = [g for g in (throttled.gap_from, errors.gap_from) if g is not None]
        return HealthDelta(throttled.seconds, errors.values, tuple(self.xids.take(reading.uuid)),
                           min(gaps) if gaps else None)

    def device_counters(self, uuid: str) -> dict[str, int]:
        """The GPU's cumulative error counters as last read (ECC left out: the reading
        has it)."""
        last = self.errors.last.get(uuid)
        return {k: v for k, v in last.values.items() if not k.startswith("ecc:")} \
            if last is not None else {}

    def hold(self, uuid: str, held: bool) -> None:
        self.throttle.readings.hold(uuid, held)
        self.errors.hold(uuid, held)

    def driver_seen(self, driver: str | None) -> None:
        self.throttle.readings.driver_seen(driver)
        self.errors.driver_seen(driver)

    def prune(self, present: set[str]) -> None:
        self.throttle.prune(present)
        self.errors.prune(present)

    def export_state(self, boot_id: str | None) -> dict[str, object]:
        return {**self.throttle.readings.export_state(boot_id),
                **self.errors.export_state(boot_id)}

    def import_state(self, data: dict[str, object], boot_id: str | None) -> None:
        self.throttle.readings.import_state(data, boot_id)
        self.errors.import_state(data, boot_id)
