"""Time a GPU spent slowed down, by reason: deltas of the driver's cumulative violation
counters (``nvmlDeviceGetViolationStatus``, nanoseconds) between two readings.

A GPU's clocks held down slow every job on it, whole GPU or MIG instance alike: the
interval's throttled seconds count in full for each job holding the GPU or one of its
instances (like allocated seconds, not split). The device total is the driver's own
counter, so it survives a restart of the agent as it is; the last reading of each held
GPU is saved (gpu/cumulative.py), so what a job's GPU spent throttled while the agent
was down is counted too, for the jobs that held it across that time.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from slurm_gpu_exporter.gpu.backend import DeviceReading
from slurm_gpu_exporter.gpu.cumulative import CumulativeReadings

# The `reason` label values, in NVML's NVML_PERF_POLICY_* order (gpu/nvml_health.py).
REASONS = ("power", "thermal", "sync_boost", "board_limit", "low_utilization",
           "reliability", "app_clocks", "base_clocks")


@dataclass(frozen=True)
class ThrottleDelta:
    """Seconds each supported reason held the GPU's clocks down in one interval."""

    seconds: Mapping[str, float]
    gap_from: float | None = None  # see gpu/cumulative.Delta


class ThrottleBook:
    """Per GPU: the last violation reading, and each interval's throttled seconds."""

    def __init__(self) -> None:
        self.readings = CumulativeReadings("throttle_readings", "GPU throttle counters")

    def interval(self, reading: DeviceReading, now: float) -> ThrottleDelta:
        """Throttled seconds by reason since the previous reading of the GPU."""
        health = reading.health
        if health is None or not health.violations_ns:
            return ThrottleDelta({})
        delta = self.readings.delta(reading.uuid, dict(health.violations_ns), now)
        return ThrottleDelta({r: ns / 1e9 for r, ns in delta.values.items()}, delta.gap_from)

    def device_seconds(self, uuid: str) -> tuple[tuple[str, float], ...]:
        """The driver's cumulative throttled seconds of the GPU by reason (a reason whose
        read failed this time: its last value)."""
        last = self.readings.last.get(uuid)
        if last is None:
            return ()
        return tuple((r, last.values[r] / 1e9) for r in REASONS if r in last.values)
