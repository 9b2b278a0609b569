"""What each poll's driver samples add to a GPU's busy time, on the per-GPU cursors into
the driver's sample buffers (gpu/driver/book.py). The arithmetic of one run of samples:
gpu/driver/gaps.py; energy: gpu/attribution/energy.py.

Nothing here reads a device or a clock: every time comes in as an argument (the host
clocks as a HostClocks), so each piece is tested on plain numbers.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass

from slurm_gpu_exporter.gpu.driver.book import DeviceBook
from slurm_gpu_exporter.gpu.driver.clocks import clock_of
from slurm_gpu_exporter.gpu.driver.cursors import SampleCursor
from slurm_gpu_exporter.gpu.driver.gaps import (
    DEFAULT_COVER_S,
    Integrated,
    cover_limit_us,
    integrate_gaps,
    measured_period_us,
)
from slurm_gpu_exporter.gpu.readings import (
    DeviceReading,
    HostClocks,
    ProcessUtilSample,
    UtilSample,
)

log = logging.getLogger(__name__)

# A driver clock never runs this much faster than the host's: a gap longer than
# that many times the host time since the last poll is a clock jump, not idle time.
MAX_DRIVER_RATE = 50.0
# A newest sample this far (one sample period; this much where the period is not
# known yet) behind the cursor is the same sample stamped a little differently, not
# a clock that went back: the buffer is dry and counting goes on.
STEP_BACK_TOLERANCE_US = 1_000_000
# Samples above 100 % up to this are a driver's overshoot (130 % has been reported):
# clamped. Above it they are garbage (nvtop #110: smUtil 37100 with a garbage
# timestamp and a zombie PID; DCGM #83: 2147483632): dropped, moving no cursor, as
# clamping would give garbage full weight.
GARBAGE_PERCENT = 200.0


def clamp_or_drop(percent: float) -> float | None:
    """A sample's percent within 0..100, or None for garbage."""
    if not 0.0 <= percent <= GARBAGE_PERCENT:
        return None
    return min(percent, 100.0)


@dataclass(frozen=True)
class PollFigures:
    """What one poll of one GPU's sample buffers gave.

    ``window``/``busy`` are None where the GPU has no device samples; ``unknown`` the
    seconds left out of both because samples may have been lost there;
    ``process_samples`` are the process samples not seen before (of processes on the
    GPU, within 0..100);
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
    unknown: float = 0.0
    samples: tuple[UtilSample, ...] = ()  # the device samples counted (within 0..100)


def since_start(figures: PollFigures, not_before_us: int) -> Integrated:
    """This poll's device samples from ``not_before_us`` on (a job's start on the
    driver's clock), integrated as the GPU's own were."""
    before = figures.before
    if before is None:
        return Integrated(0.0, 0.0, 0.0)
    return integrate_gaps(figures.samples, before.device_us, not_before_us,
                          period_us=before.period_us, counted_us=before.counted_us,
                          continuous=before.continuous, max_gap_us=figures.max_gap_us)


def held_seconds(held_until: float | None, start: float | None, first_poll: float,
                 now: float) -> float:
    """Wall seconds a held GPU adds to a job's allocated time at ``now``: since the last
    count, or for a new counter since the job's start (not before the agent's first
    poll, as nothing is known of earlier use), whether or not the driver had samples."""
    since = held_until if held_until is not None else max(start or now, first_poll)
    return max(0.0, now - since)


def idle_credit(c: SampleCursor, host_now: float) -> float:
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


def dry_from_the_start(c: SampleCursor, host_now: float) -> float:
    """Seconds of idle time of a GPU whose buffer has held no sample since the agent
    first read it (idle from the start): the host time between two dry reads."""
    since, c.dry_since = c.dry_since, host_now
    return max(0.0, host_now - since) if since is not None else 0.0


class DeviceIntegrator(DeviceBook):
    """Integrates each poll's new driver samples of a GPU into its busy and unknown time,
    on the cursors and totals of DeviceBook (gpu/driver/book.py), and drops the cursors
    where the driver's clocks restart.

    Each driver sample newer than the cursor is integrated once, so a GPU's busy time
    is exact whatever the poll interval. A cursor ahead of every sample the driver
    holds (its clock went back: NTP stepped it, the driver reloaded, or it stamps on
    another clock than before) is moved back to the newest one, so counting resumes
    at the next poll instead of stalling for as long as the jump.
    """

    def integrate(self, reading: DeviceReading, at: HostClocks) -> PollFigures:
        """This poll's new samples of one GPU, counted; ``at``: the host clocks read right
        after the sample calls."""
        uuid = reading.uuid
        c = self.cursors.setdefault(uuid, SampleCursor())
        reading, breaks, overrun = self.buffers.merge(reading, c, at)
        if overrun:
            self.events.count(uuid, "buffer_overrun")
        procs = self._process_samples(reading, c, at)
        samples = reading.util_samples
        host_now = at.monotonic if at.monotonic is not None else at.realtime
        if samples is None:
            c.continuous = False  # none now (MIG turned on): the time until some is unknown
            return PollFigures(None, None, procs)
        samples = self._in_range(uuid, samples)
        if not samples:
            newest = reading.util_buffer_newest_us
            if newest is not None and c.device_us and newest < c.device_us:
                if c.device_us - newest < (c.period_us or STEP_BACK_TOLERANCE_US):
                    self.events.count(uuid, "stamp_jitter")  # the same sample, stamped a µs off
                else:
                    self.events.rebase(reading, "device", c.device_us - newest)
                    c.rebase_device(newest)
                    c.seen_at = host_now
                    return PollFigures(0.0, 0.0, procs, clock=c.device_clock)
            if "utilization samples" in reading.failed:
                return PollFigures(0.0, 0.0, procs, clock=c.device_clock)  # not known dry
            if not c.device_us:
                return PollFigures(dry_from_the_start(c, host_now), 0.0, procs)
            return PollFigures(idle_credit(c, host_now), 0.0, procs, clock=c.device_clock)
        newest = max(s.timestamp_us for s in samples)
        clock = self.events.note_clock(reading, c, newest, at)
        if not c.device_us:
            return self._first_samples(uuid, c, samples, procs, clock, host_now)
        before = dataclasses.replace(c)
        max_gap = None
        if c.seen_at is not None:
            max_gap = MAX_DRIVER_RATE * max(host_now - c.seen_at, 1.0) * 1e6
        got = integrate_gaps(samples, c.device_us, period_us=c.period_us,
                             counted_us=c.counted_us, continuous=c.continuous,
                             max_gap_us=max_gap, breaks=breaks)
        c.period_us = measured_period_us(samples, c.period_us)
        c.device_us, c.counted_us = newest, max(c.counted_us, newest)
        c.continuous, c.seen_at = True, host_now
        self.device_busy[uuid] = self.device_busy.get(uuid, 0.0) + got.busy
        if got.unknown:
            self.device_unknown[uuid] = self.device_unknown.get(uuid, 0.0) + got.unknown
        return PollFigures(got.window, got.busy, procs, before, clock, max_gap, got.unknown,
                           samples)

    def _first_samples(self, uuid: str, c: SampleCursor, samples: tuple[UtilSample, ...],
                       procs: tuple[ProcessUtilSample, ...], clock: str | None,
                       host_now: float) -> PollFigures:
        """The first samples of a GPU. At the first look the buffer's history is nobody's
        to count; on a GPU whose buffer was empty then (idle since the agent started)
        every sample is new since the last dry read, and counts."""
        dry_since, c.dry_since = c.dry_since, None
        samples = tuple(sorted(samples, key=lambda s: s.timestamp_us))
        newest = samples[-1].timestamp_us
        c.period_us = measured_period_us(samples, c.period_us)
        c.device_us = c.counted_us = newest
        c.continuous, c.seen_at = True, host_now
        if dry_since is None:
            return PollFigures(0.0, 0.0, procs, clock=clock, samples=samples)
        period = c.period_us or int(DEFAULT_COVER_S * 1e6)
        got = integrate_gaps(samples, samples[0].timestamp_us - period, period_us=period)
        # The host time since the last dry read that the samples do not cover was idle.
        idle = max(0.0, host_now - dry_since - (newest - samples[0].timestamp_us + period) / 1e6)
        self.device_busy[uuid] = self.device_busy.get(uuid, 0.0) + got.busy
        return PollFigures(got.window + idle, got.busy, procs, clock=clock, samples=samples)

    def _in_range(self, uuid: str, samples: tuple[UtilSample, ...]) -> tuple[UtilSample, ...]:
        if all(0.0 <= s.percent <= 100.0 for s in samples):
            return samples  # the usual case: nothing to count, clamp or drop
        kept = []
        for s in samples:
            percent = clamp_or_drop(s.percent)
            if percent != s.percent:
                self.events.count(uuid, "out_of_range" if percent is None else "clamped")
            if percent is not None:
                kept.append(s if percent == s.percent else UtilSample(s.timestamp_us, percent))
        return tuple(kept)

    def _process_samples(self, reading: DeviceReading, c: SampleCursor, at: HostClocks
                         ) -> tuple[ProcessUtilSample, ...]:
        live = {p.pid for p in reading.processes}
        # A PID no longer on the GPU may move no cursor: its sample can be as old or as
        # garbled as a zombie's (GARBAGE_PERCENT).
        kept = []
        for s in reading.process_samples or ():
            percent = clamp_or_drop(s.sm_percent)
            if s.pid in live and percent != s.sm_percent:
                self.events.count(reading.uuid, "out_of_range" if percent is None else "clamped")
            if s.pid in live and percent is not None:
                kept.append(dataclasses.replace(s, sm_percent=percent))
        samples = tuple(kept)
        if not samples:
            newest = reading.process_buffer_newest_us
            last_seen = c.process_last_seen()
            if newest is not None and last_seen and newest < last_seen:
                if last_seen - newest < (c.period_us or STEP_BACK_TOLERANCE_US):
                    self.events.count(reading.uuid, "stamp_jitter")
                else:
                    self.events.rebase(reading, "process", last_seen - newest)
                    c.rebase_processes(newest)
            c.live_pids = live
            return ()
        newest = max(s.timestamp_us for s in samples)
        c.process_clock = clock_of(newest, at)
        return c.new_process_samples(samples, live)

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
        self.buffers.stashes.clear()  # what was read between polls is on the old clocks
