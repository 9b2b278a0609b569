"""Time a GPU spent slowed down, by reason: deltas of the driver's cumulative violation
counters (``nvmlDeviceGetViolationStatus``, nanoseconds) between two readings.

A GPU's clocks held down slow every job on it, whole GPU or MIG instance alike: the
interval's throttled seconds count in full for each job holding the GPU or one of its
instances (like allocated seconds, not split). The device total is the driver's own
counter, so it survives a restart of the agent as it is; the last reading of each held
GPU is saved (gpu/attribution/cumulative.py), so what a job's GPU spent throttled while the agent
was down is counted too, for the jobs that held it across that time.

A GPU without any violation counter (the call is deprecated from NVML 13 and a driver
may drop it) is sampled instead: at each poll, the reasons set in its current
clocks-event reasons count the interval since the last poll. An estimate, kept by the
agent only (it restarts at 0 with the agent, and the device series with it).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from slurm_gpu_exporter.gpu.attribution.cumulative import CumulativeReadings
from slurm_gpu_exporter.gpu.readings import DeviceReading

# The `reason` label values, in NVML's NVML_PERF_POLICY_* order (gpu/nvml/health.py).
REASONS = ("power", "thermal", "sync_boost", "board_limit", "low_utilization",
           "reliability", "app_clocks", "base_clocks")


@dataclass(frozen=True)
class ThrottleDelta:
    """Seconds each supported reason held the GPU's clocks down in one interval."""

    seconds: Mapping[str, float]
    gap_from: float | None = None  # see gpu/cumulative.Delta


# Where a GPU has no violation counters: the nvmlClocksEventReason* bits that stand for
# each reason (nvml.h). app_clocks is any limiter; base_clocks has no bit.
REASON_BITS = {"power": 0x4 | 0x80, "thermal": 0x20 | 0x40, "sync_boost": 0x10,
               "board_limit": 0x200, "low_utilization": 0x1, "reliability": 0x400,
               "app_clocks": 0x4 | 0x8 | 0x10 | 0x20 | 0x40 | 0x80 | 0x200 | 0x400}


class ThrottleBook:
    """Per GPU: the last violation reading, and each interval's throttled seconds."""

    def __init__(self) -> None:
        self.readings = CumulativeReadings("throttle_readings", "GPU throttle counters")
        # GPUs without violation counters: nanoseconds counted by sampling the current
        # reasons (the interval up to a poll counts for each reason set at it), and when.
        self.sampled: dict[str, tuple[dict[str, int], float]] = {}

    def interval(self, reading: DeviceReading, now: float) -> ThrottleDelta:
        """Throttled seconds by reason since the previous reading of the GPU."""
        health = reading.health
        violations = dict(health.violations_ns) if health is not None else {}
        if not violations and health is not None:
            violations = self._sampled(reading.uuid, health.clocks_event_reasons,
                                       health.clocks_event_reasons_supported, now)
        if not violations:
            return ThrottleDelta({})
        delta = self.readings.delta(reading.uuid, violations, now)
        return ThrottleDelta({r: ns / 1e9 for r, ns in delta.values.items()}, delta.gap_from)

    def _sampled(self, uuid: str, reasons: int | None, supported: int | None,
                 now: float) -> dict[str, int]:
        """An estimate from the current reasons where the GPU has no violation counters:
        cumulative ns, kept by the agent (from 0 at its start), of the supported reasons."""
        if reasons is None or not supported:
            return {}
        totals, at = self.sampled.get(uuid, ({r: 0 for r, bits in REASON_BITS.items()
                                              if bits & supported}, now))
        seconds = max(0.0, now - at)
        totals = {r: ns + (round(seconds * 1e9) if REASON_BITS[r] & reasons else 0)
                  for r, ns in totals.items()}
        self.sampled[uuid] = (totals, now)
        return totals

    def prune(self, present: set[str]) -> None:
        self.readings.prune(present)
        for uuid in [u for u in self.sampled if u not in present]:
            del self.sampled[uuid]

    def device_seconds(self, uuid: str) -> tuple[tuple[str, float], ...]:
        """The driver's cumulative throttled seconds of the GPU by reason (a reason whose
        read failed this time: its last value)."""
        last = self.readings.last.get(uuid)
        if last is None:
            return ()
        return tuple((r, last.values[r] / 1e9) for r in REASONS if r in last.values)
