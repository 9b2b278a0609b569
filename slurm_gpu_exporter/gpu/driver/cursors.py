"""Where each GPU's driver sample buffers have been read up to, on the driver's own clocks.

Timestamps stay the driver's (they go back to it as ``lastSeenTimeStamp``); what
clock each call is on is kept beside them (gpu/driver/clocks.py). Process samples get a
cursor per process: drivers hand out one sample per process per read, each with
its own, sometimes seconds-old timestamp, so one cursor at the newest would skip
the next sample of every process that lags behind it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from slurm_gpu_exporter.gpu.readings import ProcessUtilSample

# A process sample may lag the newest one by up to this much (reports: up to 9 s);
# a process without a cursor yet is looked for this far back.
MAX_PROCESS_LAG_US = 10_000_000


@dataclass
class SampleCursor:
    """One GPU's read position in the driver's sample buffers.

    ``device_us`` is the newest device sample seen (0: none yet); ``counted_us``
    how far the GPU's window has been counted on that clock, past ``device_us``
    where an idle gap (a buffer that ran dry) was counted before the next sample
    came. ``continuous`` says the previous poll was read by this agent (not
    restored from the state dir, not after a frozen NVML), so a gap up to the next
    sample is idle time rather than samples lost while nobody read them.
    """

    device_us: int = 0
    counted_us: int = 0
    period_us: int = 0  # device sample period, measured from the samples (0: unknown)
    device_clock: str | None = None
    processes: dict[int, int] = field(default_factory=dict)  # pid -> newest sample seen
    process_high_us: int = 0  # newest process sample seen of any process
    process_clock: str | None = None
    continuous: bool = False
    seen_at: float | None = None  # host monotonic time when device_us was read
    live_pids: set[int] = field(default_factory=set)  # processes on the GPU at the last poll
    dry_since: float | None = None  # host monotonic time of the last dry read before any sample

    def process_last_seen(self) -> int:
        """The ``lastSeenTimeStamp`` for process samples: the oldest of the newest per
        live process (a live one without a cursor yet counts from MAX_PROCESS_LAG_US
        back), never more than that behind the newest seen."""
        if not self.process_high_us:
            return 0
        floor = max(0, self.process_high_us - MAX_PROCESS_LAG_US)
        oldest = min((self.processes.get(pid, 0) for pid in self.live_pids),
                     default=self.process_high_us)
        return max(floor, oldest)

    def new_process_samples(self, samples: tuple[ProcessUtilSample, ...],
                            live_pids: set[int]) -> tuple[ProcessUtilSample, ...]:
        """The samples not seen before (each process against its own cursor); moves the
        cursors and forgets those of processes no longer on the GPU."""
        floor = max(0, self.process_high_us - MAX_PROCESS_LAG_US) if self.process_high_us \
            else 0
        fresh = tuple(s for s in samples if s.timestamp_us > self.processes.get(s.pid, floor))
        for s in fresh:
            self.processes[s.pid] = max(self.processes.get(s.pid, 0), s.timestamp_us)
            self.process_high_us = max(self.process_high_us, s.timestamp_us)
        for pid in [p for p in self.processes if p not in live_pids]:
            del self.processes[pid]
        self.live_pids = live_pids
        return fresh

    def rebase_processes(self, newest_us: int) -> None:
        """The process clock went back: continue from the newest sample the driver holds."""
        self.processes = {pid: newest_us for pid in self.live_pids}
        self.process_high_us = newest_us

    def rebase_device(self, newest_us: int) -> None:
        """The device clock went back: continue from the newest sample the driver holds;
        the gap up to the next sample is unknown time, not idle."""
        self.device_us = self.counted_us = newest_us
        self.continuous = False

    def to_state(self) -> dict[str, Any]:
        return {"device": self.device_us, "counted": self.counted_us, "period": self.period_us,
                "device_clock": self.device_clock, "process_clock": self.process_clock,
                "process_high": self.process_high_us,
                "processes": [[pid, us] for pid, us in self.processes.items()]}

    @classmethod
    def from_state(cls, data: Any) -> SampleCursor | None:
        """A saved cursor; None where it cannot be read. It is not continuous: the gap
        up to the next sample is time nobody read."""
        try:
            cursor = cls(device_us=int(data["device"]), counted_us=int(data["counted"]),
                         period_us=int(data["period"]),
                         device_clock=_clock_name(data.get("device_clock")),
                         process_clock=_clock_name(data.get("process_clock")),
                         process_high_us=int(data.get("process_high", 0)),
                         processes={int(p): int(us) for p, us in data.get("processes", [])})
        except (TypeError, ValueError, KeyError, AttributeError):
            return None
        if min(cursor.device_us, cursor.counted_us, cursor.period_us,
               cursor.process_high_us) < 0:
            return None
        return cursor


def _clock_name(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise ValueError("clock name")
