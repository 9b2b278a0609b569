"""The pure arithmetic of GPU sampling: driver samples into busy seconds, wall time held,
and the per-GPU cursors into the driver's sample buffers (energy: gpu/energy.py).

Nothing here reads a device or a clock: every time comes in as an argument (the host
clocks as a HostClocks), so each piece is tested on plain numbers.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import statistics
from dataclasses import dataclass
from typing import Any

from slurm_gpu_exporter.gpu.backend import DeviceReading, ProcessUtilSample, UtilSample
from slurm_gpu_exporter.gpu.clocks import HostClocks, clock_of
from slurm_gpu_exporter.gpu.cursors import SampleCursor

log = logging.getLogger(__name__)

# A sample covers the time since the one before it, unless that gap is longer than
# this many sample periods (one missing sample with the usual jitter is ~2.3): then
# the GPU was idle (drivers take no samples while it is) and the sample covers one
# period; the rest of the gap is idle time.
COVER_PERIODS = 2.5
# Where the period is not known yet, a sample covers at most this much.
DEFAULT_COVER_S = 2.0
# A driver clock never runs this much faster than the host's: a gap longer than
# that many times the host time since the last poll is a clock jump, not idle time.
MAX_DRIVER_RATE = 50.0


def measured_period_us(samples: tuple[UtilSample, ...], previous_us: int = 0) -> int:
    """The driver's sample period (µs): the median spacing of these samples, or the one
    measured before where there are too few."""
    stamps = [s.timestamp_us for s in samples]
    spacings = [b - a for a, b in itertools.pairwise(stamps) if b > a]
    return int(statistics.median(spacings)) if len(spacings) >= 2 else previous_us


def cover_limit_us(period_us: int) -> float:
    """The longest gap one sample covers; longer gaps hold idle time."""
    return COVER_PERIODS * period_us if period_us else DEFAULT_COVER_S * 1e6


def integrate_samples(samples: tuple[UtilSample, ...], cursor_us: int | None,
                      not_before_us: int = 0, *, period_us: int = 0, counted_us: int = 0,
                      continuous: bool = True, max_gap_us: float | None = None,
                      ) -> tuple[float, float]:
    """(window, busy) seconds from driver samples, each covering the time since the one
    before.

    With no cursor (first look) the first sample only starts the window. After a gap
    longer than ``cover_limit_us`` a sample covers one period (measured from the
    samples, else ``period_us``) and the rest of the gap counts as idle: in the
    window, not busy. A gap is left out of both instead where samples may have been
    lost: from a cursor this agent did not read ``continuous``-ly (restored from the
    state dir, NVML frozen), or longer than ``max_gap_us`` (the clock jumped). Time
    before ``not_before_us`` (a job's start) or ``counted_us`` (counted already as
    idle) is left out too. Percentages are clamped to 0..100.
    """
    period = measured_period_us(samples, period_us)
    cover = cover_limit_us(period)
    floor = max(not_before_us, counted_us)
    window = busy = 0.0
    previous = cursor_us
    for sample in samples:
        ts = sample.timestamp_us
        if previous is None:
            previous = ts
            continue
        gap = ts - previous
        if gap <= 0:
            continue
        if (max_gap_us is not None and gap > max_gap_us) or (
                gap > cover and previous == cursor_us and not continuous):
            previous = ts  # samples were lost here, or the clock jumped
            continue
        covered_from = previous if gap <= cover else ts - (period or cover)
        start = max(previous, floor)
        if ts > start:
            window += (ts - start) / 1e6
        busy_from = max(covered_from, floor)
        if ts > busy_from:
            busy += (ts - busy_from) / 1e6 * min(max(sample.percent, 0.0), 100.0) / 100.0
        previous = ts
    return window, busy


@dataclass(frozen=True)
class PollFigures:
    """What one poll of one GPU's sample buffers gave.

    ``window``/``busy`` are None where the GPU has no device samples;
    ``process_samples`` are the process samples not seen before (clamped to 0..100);
    ``before`` is the device cursor before this poll (None where there was nothing to
    integrate), ``clock`` the host clock this poll's device samples are on (None:
    none of them), ``max_gap_us`` the longest gap that can be idle time.
    """

    window: float | None
    busy: float | None
    process_samples: tuple[ProcessUtilSample, ...] = ()
    before: SampleCursor | None = None
    clock: str | None = None
    max_gap_us: float | None = None


def since_start(samples: tuple[UtilSample, ...], figures: PollFigures, not_before_us: int
               ) -> tuple[float, float]:
    """(window, busy) of this poll's device samples from ``not_before_us`` on (a job's
    start on the driver's clock), integrated as the GPU's own were."""
    before = figures.before
    if before is None:
        return 0.0, 0.0
    return integrate_samples(samples, before.device_us, not_before_us,
                             period_us=before.period_us, counted_us=before.counted_us,
                             continuous=before.continuous, max_gap_us=figures.max_gap_us)


def held_seconds(held_until: float | None, start: float | None, first_poll: float,
                 now: float) -> float:
    """Wall seconds a held GPU adds to a job's allocated time at ``now``: since the last
    count, or for a new counter since the job's start (not before the agent's first
    poll, as nothing is known of earlier use), whether or not the driver had samples."""
    since = held_until if held_until is not None else max(start or now, first_poll)
    return max(0.0, now - since)


class DeviceIntegrator:
    """Per GPU: the cursors into the driver's sample buffers, busy-time totals and how
    many samples had to be clamped.

    Each driver sample newer than the cursor is integrated once, so a GPU's busy time
    is exact whatever the poll interval. A cursor ahead of every sample the driver
    holds (its clock went back: NTP stepped it, the driver reloaded, or it stamps on
    another clock than before) is moved back to the newest one, so counting resumes
    at the next poll instead of stalling for as long as the jump.
    """

    def __init__(self) -> None:
        self.cursors: dict[str, SampleCursor] = {}
        self.device_busy: dict[str, float] = {}
        self.clamped: dict[str, int] = {}  # uuid -> samples clamped to 0..100
        self._warned: set[tuple[str, str]] = set()  # (uuid, what): logged once
        self.restored_driver: str | None = None  # the driver the saved cursors are of
        self._generation = 0  # the backend init the cursors belong to

    def driver_cursors(self) -> dict[str, tuple[int, int]]:
        """The ``lastSeenTimeStamp`` values to read each GPU from: (device, process)."""
        return {uuid: (c.device_us, c.process_last_seen()) for uuid, c in self.cursors.items()}

    def integrate(self, reading: DeviceReading, at: HostClocks) -> PollFigures:
        """This poll's new samples of one GPU, counted; ``at``: the host clocks read right
        after the sample calls."""
        uuid = reading.uuid
        c = self.cursors.setdefault(uuid, SampleCursor())
        procs = self._process_samples(reading, c, at)
        samples = reading.util_samples
        host_now = at.monotonic if at.monotonic is not None else at.realtime
        if samples is None:
            return PollFigures(None, None, procs)
        if not samples:
            newest = reading.util_buffer_newest_us
            if newest is not None and c.device_us and newest < c.device_us:
                self._log_rebase(reading, "device", c.device_us - newest)
                c.rebase_device(newest)
                c.seen_at = host_now
                return PollFigures(0.0, 0.0, procs, clock=c.device_clock)
            if "utilization samples" in reading.failed:
                return PollFigures(0.0, 0.0, procs, clock=c.device_clock)  # not known dry
            if not c.device_us:
                return PollFigures(self._dry_from_the_start(c, host_now), 0.0, procs)
            return PollFigures(self._idle_credit(c, host_now), 0.0, procs, clock=c.device_clock)
        self.clamped[uuid] = self.clamped.get(uuid, 0) + sum(
            1 for s in samples if not 0.0 <= s.percent <= 100.0)
        newest = max(s.timestamp_us for s in samples)
        clock = self._note_clock(reading, c, newest, at)
        if not c.device_us:
            # The first look: the buffer's history is nobody's to count.
            c.dry_since = None
            c.device_us = c.counted_us = newest
            c.period_us = measured_period_us(samples, c.period_us)
            c.continuous, c.seen_at = True, host_now
            return PollFigures(0.0, 0.0, procs, clock=clock)
        before = dataclasses.replace(c)
        max_gap = None
        if c.seen_at is not None:
            max_gap = MAX_DRIVER_RATE * max(host_now - c.seen_at, 1.0) * 1e6
        window, busy = integrate_samples(samples, c.device_us, period_us=c.period_us,
                                         counted_us=c.counted_us, continuous=c.continuous,
                                         max_gap_us=max_gap)
        c.period_us = measured_period_us(samples, c.period_us)
        c.device_us, c.counted_us = newest, max(c.counted_us, newest)
        c.continuous, c.seen_at = True, host_now
        self.device_busy[uuid] = self.device_busy.get(uuid, 0.0) + busy
        return PollFigures(window, busy, procs, before, clock, max_gap)

    def _idle_credit(self, c: SampleCursor, host_now: float) -> float:
        """Seconds of idle time to count while the driver's buffer has run dry: up to a
        little before where its clock has got to at most (estimated at the host's rate,
        which never overshoots a driver clock that runs faster, as in sped-up tests)."""
        if not (c.continuous and c.device_us and c.seen_at is not None):
            return 0.0
        end = c.device_us + (host_now - c.seen_at) * 1e6 - cover_limit_us(c.period_us)
        if end <= c.counted_us:
            return 0.0
        window = (end - c.counted_us) / 1e6
        c.counted_us = int(end)
        return window

    @staticmethod
    def _dry_from_the_start(c: SampleCursor, host_now: float) -> float:
        """Seconds of idle time of a GPU whose buffer has held no sample since the agent
        first read it (idle from the start): the host time between two dry reads."""
        since, c.dry_since = c.dry_since, host_now
        return max(0.0, host_now - since) if since is not None else 0.0

    def _process_samples(self, reading: DeviceReading, c: SampleCursor, at: HostClocks
                         ) -> tuple[ProcessUtilSample, ...]:
        samples = reading.process_samples
        live = {p.pid for p in reading.processes}
        if not samples:
            newest = reading.process_buffer_newest_us
            last_seen = c.process_last_seen()
            if newest is not None and last_seen and newest < last_seen:
                self._log_rebase(reading, "process", last_seen - newest)
                c.rebase_processes(newest)
            c.live_pids = live
            return ()
        out_of_range = [s for s in samples if not 0.0 <= s.sm_percent <= 100.0]
        if out_of_range:
            self.clamped[reading.uuid] = self.clamped.get(reading.uuid, 0) + len(out_of_range)
            samples = tuple(dataclasses.replace(s, sm_percent=min(max(s.sm_percent, 0.0), 100.0))
                            for s in samples)
        newest = max(s.timestamp_us for s in samples)
        c.process_clock = clock_of(newest, at)
        return c.new_process_samples(samples, live)

    def _note_clock(self, reading: DeviceReading, c: SampleCursor, newest_us: int,
                    at: HostClocks) -> str | None:
        """The host clock of this poll's device samples; a GPU on none is logged once."""
        clock = clock_of(newest_us, at)
        if clock is None and (reading.uuid, "clock") not in self._warned:
            self._warned.add((reading.uuid, "clock"))
            log.warning("GPU %d (%s): driver sample timestamps are %.0f s off the wall clock "
                        "and on no other host clock; busy time is still counted, but a job's "
                        "first window is not trimmed to its start", reading.index, reading.uuid,
                        newest_us / 1e6 - at.realtime)
        elif clock is not None and c.device_clock not in (None, clock):
            log.info("GPU %d (%s): device samples are now stamped on CLOCK_%s (were on "
                     "CLOCK_%s)", reading.index, reading.uuid, clock.upper(),
                     c.device_clock.upper())
        c.device_clock = clock
        return clock

    def _log_rebase(self, reading: DeviceReading, what: str, ahead_us: int) -> None:
        if (reading.uuid, what) in self._warned:
            log.debug("GPU %s: %s sample cursor re-based again", reading.uuid, what)
            return
        self._warned.add((reading.uuid, what))
        log.warning("GPU %d (%s): the driver's %s sample clock went back %.0f s (a clock "
                    "step, a driver reload or another clock); counting resumes from its "
                    "newest sample", reading.index, reading.uuid, what, ahead_us / 1e6)

    def driver_seen(self, generation: int, driver: str | None) -> None:
        """Drop the cursors when NVML was initialised again (a driver reload restarts its
        clocks) or, at the first init, when the saved ones are of another driver."""
        if generation == self._generation:
            return
        first, self._generation = self._generation == 0, generation
        if not first:
            self.drop_cursors("NVML was initialised again (a driver reload?)")
        elif self.restored_driver not in (None, driver):
            self.drop_cursors(f"the driver changed from {self.restored_driver} to {driver}")

    def drop_cursors(self, why: str) -> None:
        """Forget every read position (a new boot, a driver reload): each GPU's next poll
        is a first look again."""
        if self.cursors:
            log.info("driver sample cursors dropped: %s; each GPU starts afresh", why)
        self.cursors.clear()

    def interrupted(self) -> None:
        """NVML was frozen or down for a while: the gap up to each GPU's next sample may
        hold samples nobody read, and is not idle time."""
        for c in self.cursors.values():
            c.continuous = False
            c.dry_since = None

    def prune(self, present: set[str]) -> None:
        """Forget GPUs no longer present (a MIG layout changed, a GPU was removed)."""
        for cache in (self.cursors, self.device_busy, self.clamped):
            for uuid in [u for u in cache if u not in present]:
                del cache[uuid]
        self._warned = {w for w in self._warned if w[0] in present}

    def export_state(self) -> dict[str, Any]:
        """Busy totals and the cursors' content (state.py stamps the boot and driver)."""
        return {"cursors_by_gpu": {uuid: c.to_state() for uuid, c in self.cursors.items()},
                "device_busy": dict(self.device_busy)}

    def import_state(self, data: dict[str, Any], cursors: dict[str, Any],
                     driver: str | None = None) -> None:
        """Busy totals from ``data``; ``cursors`` the saved cursors of this boot by GPU,
        read from ``driver``."""
        self.restored_driver = driver
        for uuid, raw in cursors.items():
            cursor = SampleCursor.from_state(raw)
            if cursor is not None:
                self.cursors[str(uuid)] = cursor
        for uuid, busy in (data.get("device_busy") or {}).items():
            if isinstance(busy, int | float):
                self.device_busy[uuid] = float(busy)
