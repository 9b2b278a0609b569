"""The pure arithmetic of GPU sampling: driver samples into busy seconds, energy deltas,
wall time held, and whether the driver stamps its samples on the wall clock.

Nothing here reads a device or a clock: every time comes in as an argument, so each
piece is tested on plain numbers.
"""

from __future__ import annotations

import itertools
import logging
import statistics
from collections.abc import Iterable
from typing import Any

from slurm_gpu_exporter.gpu.backend import DeviceReading, UtilSample

log = logging.getLogger(__name__)

# Gaps between driver samples longer than this are not integrated (samples were
# lost, e.g. the agent was down longer than the driver's buffer reaches back).
MIN_MAX_GAP_S = 2.0

# Driver sample timestamps further than this from the wall clock are on another
# clock: they are still integrated, but never compared with a job's start.
CLOCK_TOLERANCE_S = 60.0


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


def held_seconds(held_until: float | None, start: float | None, first_poll: float,
                 now: float) -> float:
    """Wall seconds a held GPU adds to a job's allocated time at ``now``: since the last
    count, or for a new counter since the job's start (not before the agent's first
    poll, as nothing is known of earlier use), whether or not the driver had samples."""
    since = held_until if held_until is not None else max(start or now, first_poll)
    return max(0.0, now - since)


def clock_offset_s(samples: Iterable[UtilSample], now: float) -> float:
    """Seconds by which the newest driver sample is ahead of the wall clock (0 without one)."""
    newest = max((s.timestamp_us for s in samples), default=None)
    return 0.0 if newest is None else newest / 1e6 - now


def energy_delta_j(previous_mj: int | None, current_mj: int) -> float:
    """Joules between two readings of the driver's cumulative energy counter; 0 on the
    first look or when the counter went back (the driver reloaded)."""
    if previous_mj is None or current_mj < previous_mj:
        return 0.0
    return (current_mj - previous_mj) / 1000.0


class DeviceIntegrator:
    """Per GPU: the driver-sample cursors, busy-time totals and last energy reading.

    Each driver sample newer than the cursor is integrated once, so a GPU's busy
    time is exact whatever the poll interval.
    """

    def __init__(self) -> None:
        self.cursors: dict[str, tuple[int, int]] = {}  # uuid -> (device, process) cursor, us
        self.device_busy: dict[str, float] = {}
        self.last_energy: dict[str, int] = {}
        self._clock_warned: set[str] = set()

    def integrate(self, reading: DeviceReading) -> tuple[float | None, float | None]:
        """(window seconds, busy seconds) covered by the new driver samples, or (None, None)."""
        uuid = reading.uuid
        dev_cursor, proc_cursor = self.cursors.get(uuid, (0, 0))
        if reading.process_samples:
            proc_cursor = max(proc_cursor, max(s.timestamp_us for s in reading.process_samples))
        samples = reading.util_samples
        if samples is None:
            self.cursors[uuid] = (dev_cursor, proc_cursor)
            return None, None
        if not samples or not dev_cursor:
            # Nothing new, or the first look: the buffer's history is not this job's.
            last = samples[-1].timestamp_us if samples else dev_cursor
            self.cursors[uuid] = (last, proc_cursor)
            return 0.0, 0.0
        window, busy = integrate_samples(samples, dev_cursor)
        self.cursors[uuid] = (samples[-1].timestamp_us, proc_cursor)
        self.device_busy[uuid] = self.device_busy.get(uuid, 0.0) + busy
        return window, busy

    def energy_delta(self, reading: DeviceReading) -> float | None:
        """Joules since the previous reading; None where the GPU has no energy counter.

        A read that failed counts 0 now: the last good value is kept, so the next good
        read counts the energy used in between (the driver's counter is cumulative).
        """
        if reading.energy_mj is None:
            return 0.0 if "energy" in reading.failed else None
        last = self.last_energy.get(reading.uuid)
        self.last_energy[reading.uuid] = reading.energy_mj
        return energy_delta_j(last, reading.energy_mj)

    def energy_mj(self, reading: DeviceReading) -> int | None:
        """The energy counter to export: after a failed read, the last good one."""
        if reading.energy_mj is None and "energy" in reading.failed:
            return self.last_energy.get(reading.uuid)
        return reading.energy_mj

    def driver_clock_ok(self, reading: DeviceReading, now: float) -> bool:
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

    def prune(self, present: set[str]) -> None:
        """Forget GPUs no longer present (a MIG layout changed, a GPU was removed)."""
        for cache in (self.cursors, self.last_energy, self.device_busy):
            for uuid in [u for u in cache if u not in present]:
                del cache[uuid]
        self._clock_warned &= present

    def export_state(self) -> dict[str, Any]:
        return {"cursors": {uuid: list(c) for uuid, c in self.cursors.items()},
                "device_busy": dict(self.device_busy)}

    def import_state(self, data: dict[str, Any]) -> None:
        for uuid, cursor in (data.get("cursors") or {}).items():
            if isinstance(cursor, list) and len(cursor) == 2:
                self.cursors[uuid] = (int(cursor[0]), int(cursor[1]))
        for uuid, busy in (data.get("device_busy") or {}).items():
            if isinstance(busy, int | float):
                self.device_busy[uuid] = float(busy)
