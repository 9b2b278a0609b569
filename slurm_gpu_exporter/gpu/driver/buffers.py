"""Reading the driver's sample buffers between two samples, so that none overruns unseen.

A driver keeps a fixed number of utilization samples per GPU (a ring buffer) and
overwrites the oldest: a poll later than the buffer's span (its length times the
sample period) finds the samples it missed gone, and their time would look idle.
The span is learned from the driver: every read takes the whole device buffer (from
timestamp 0) and notes how many samples it holds and its oldest. Once the oldest is
newer than the oldest of an earlier read, the buffer has dropped a sample it held:
it is full, and the samples it holds then are its length. Until that is seen, the
most samples a read returned (a lower bound), taken as at least MIN_SPAN_S. The agent
reads the buffers every quarter of that span (two sample buffers, far cheaper than a
whole sample) and keeps what it read here until the next sample integrates it, so a
long ``--sample-interval`` loses nothing. Where a read comes later than the span
anyway (the agent stalled, the host suspended), the gap before its first new sample
may hold overwritten samples: it is marked, and counted as unknown time, not idle.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from slurm_gpu_exporter.gpu.driver.cursors import SampleCursor
from slurm_gpu_exporter.gpu.driver.gaps import cover_limit_us
from slurm_gpu_exporter.gpu.readings import (
    BufferRead,
    BufferShape,
    DeviceReading,
    HostClocks,
    ProcessUtilSample,
    UtilSample,
)

# The span a buffer is taken to hold until it is seen full (the fake's 120 samples at
# 1/6 s; measure a real GPU's with scripts/gpu-check --probe).
MIN_SPAN_S = 20.0
# Reads between two polls are never closer than this.
MIN_READ_INTERVAL_S = 0.5
# Read every this fraction of the span: one late or skipped read still loses nothing.
READ_FRACTION = 0.25


@dataclass
class BufferStash:
    """One GPU: what reads between two samples found, and what its buffer holds."""

    device: list[UtilSample] = field(default_factory=list)
    processes: list[ProcessUtilSample] = field(default_factory=list)
    seen: set[tuple[int, int]] = field(default_factory=set)  # (pid, µs) stashed
    breaks: set[int] = field(default_factory=set)  # samples after a possibly overrun gap
    capacity: int = 0  # the most samples one read returned
    full: int = 0  # the samples the buffer held when seen full (0: not seen yet)
    oldest_us: int | None = None  # the oldest sample the last whole read found
    last_read: float | None = None  # host time (boot clock s) of the last read

    def span_s(self, period_us: int) -> float:
        """The time the buffer holds at the least (all samples one period apart)."""
        if self.full and period_us:
            return self.full * period_us / 1e6
        return max(MIN_SPAN_S, self.capacity * period_us / 1e6)

    def read_interval(self, period_us: int) -> float:
        return max(MIN_READ_INTERVAL_S, READ_FRACTION * self.span_s(period_us))

    def whole(self, shape: BufferShape | None) -> None:
        """Learn from what a read of the whole buffer found."""
        if shape is None or shape.oldest_us is None:
            return
        self.capacity = max(self.capacity, shape.held)
        if self.oldest_us is not None and shape.oldest_us > self.oldest_us:
            self.full = max(self.full, shape.held)  # it dropped a sample it held
        self.oldest_us = shape.oldest_us

    def note(self, samples: tuple[UtilSample, ...], last_seen_us: int, host_s: float,
             period_us: int, cover_us: float, shape: BufferShape | None = None) -> bool:
        """Learn from one read's device samples (oldest first, those newer than
        ``last_seen_us``) and what the whole buffer held; True where the gap before the
        first may hold samples the driver overwrote (the read came too late)."""
        late = (self.last_read is not None
                and host_s - self.last_read > self.span_s(period_us))
        self.last_read = host_s
        self.whole(shape)
        if not samples:
            return False
        self.capacity = max(self.capacity, len(samples))
        if late and last_seen_us and samples[0].timestamp_us - last_seen_us > cover_us:
            self.breaks.add(samples[0].timestamp_us)
            return True
        return False

    def read_on_from(self, cursor_us: int) -> int:
        """The device timestamp to read on from: past the stashed samples."""
        return self.device[-1].timestamp_us if self.device else cursor_us

    def keep(self, read: BufferRead) -> None:
        """Stash a read between two samples (device samples already noted)."""
        newest = self.device[-1].timestamp_us if self.device else 0
        self.device.extend(s for s in read.util_samples or () if s.timestamp_us > newest)
        for s in read.process_samples or ():
            if (s.pid, s.timestamp_us) not in self.seen:
                self.seen.add((s.pid, s.timestamp_us))
                self.processes.append(s)

    def merged(self, reading: DeviceReading) -> DeviceReading:
        """The reading with what was stashed since the last sample before its own samples;
        empties the stash."""
        if not (self.device or self.processes):
            return reading
        newest = self.device[-1].timestamp_us if self.device else 0
        util = reading.util_samples
        if util is not None:
            util = (*self.device, *(s for s in util if s.timestamp_us > newest))
        procs = reading.process_samples
        if procs is not None:
            procs = (*self.processes,
                     *(s for s in procs if (s.pid, s.timestamp_us) not in self.seen))
        self.device, self.processes, self.seen = [], [], set()
        return dataclasses.replace(reading, util_samples=util, process_samples=procs)

    def take_breaks(self) -> set[int]:
        breaks, self.breaks = self.breaks, set()
        return breaks


def host_seconds(at: HostClocks) -> float:
    """The host time reads are spaced on: the boot clock, which a suspend moves on."""
    return at.boottime if at.boottime is not None else at.realtime


class BufferReads:
    """Every GPU's BufferStash, against the integrator's cursors (gpu/driver/cursors.py)."""

    def __init__(self) -> None:
        self.stashes: dict[str, BufferStash] = {}

    def cursors(self, cursors: dict[str, SampleCursor]) -> dict[str, tuple[int, int]]:
        """Where a poll reads each GPU with sample buffers from (past what is stashed)."""
        return {uuid: (stash.read_on_from(cursors[uuid].device_us),
                       cursors[uuid].process_last_seen())
                for uuid, stash in self.stashes.items() if uuid in cursors}

    def read_cursors(self, cursors: dict[str, SampleCursor]) -> dict[str, tuple[int, int]]:
        """Where a read between two polls reads from: the whole device buffer (from 0),
        which is how its length is learned (keep() drops what was seen), and the process
        samples past the cursor."""
        return {uuid: (0, cursors[uuid].process_last_seen())
                for uuid in self.stashes if uuid in cursors}

    def read_interval(self, cursors: dict[str, SampleCursor]) -> float | None:
        """Seconds until the buffers should be read again (None: no GPU has any)."""
        return min((stash.read_interval(cursors[uuid].period_us)
                    for uuid, stash in self.stashes.items() if uuid in cursors), default=None)

    def keep(self, reads: list[BufferRead], cursors: dict[str, SampleCursor],
             at: HostClocks) -> list[str]:
        """Stash reads made between two polls; returns the GPUs whose read came too late."""
        overruns = []
        for read in reads:
            c, stash = cursors.get(read.uuid), self.stashes.get(read.uuid)
            if c is None or stash is None:
                continue
            last = stash.read_on_from(c.device_us)
            util = tuple(s for s in sorted(read.util_samples or (), key=_stamp)
                         if s.timestamp_us > last)
            if stash.note(util, last, host_seconds(at), c.period_us,
                          cover_limit_us(c.period_us), read.util_buffer):
                overruns.append(read.uuid)
            stash.keep(dataclasses.replace(read, util_samples=util))
        return overruns

    def merge(self, reading: DeviceReading, c: SampleCursor, at: HostClocks
              ) -> tuple[DeviceReading, set[int], bool]:
        """A poll's reading with what was stashed since the last one, the samples after a
        possibly overrun gap, and whether this poll's own read found one."""
        if reading.util_samples is None:
            self.stashes.pop(reading.uuid, None)  # no buffer (MIG, not supported)
            return reading, set(), False
        stash = self.stashes.setdefault(reading.uuid, BufferStash())
        last = stash.read_on_from(c.device_us)
        own = tuple(s for s in sorted(reading.util_samples, key=_stamp) if s.timestamp_us > last)
        overrun = stash.note(own, last, host_seconds(at), c.period_us,
                             cover_limit_us(c.period_us), reading.util_buffer)
        return stash.merged(reading), stash.take_breaks(), overrun

    def prune(self, present: set[str]) -> None:
        for uuid in [u for u in self.stashes if u not in present]:
            del self.stashes[uuid]


def _stamp(s: UtilSample) -> int:
    return s.timestamp_us
