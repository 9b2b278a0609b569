"""The agent's own process figures (CPU, memory, start time, file descriptors), the
families prometheus_client's ProcessCollector exports, read at a fraction of its cost.

They are read with every sample (a scrape reads no file), and most samples are never
scraped: a read is kept as raw numbers (one ``/proc/self/stat`` read, the descriptor
count, the open-files limit from ``getrlimit``, which is what ``/proc/self/limits``
shows) and made into families only when an exposition is rendered.
"""

from __future__ import annotations

import os
import resource
from typing import NamedTuple

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

PROC = "/proc"


class ProcessReading(NamedTuple):
    """One read of /proc/self: the stat fields ProcessCollector uses, and the fds."""

    vmem: float
    rss_pages: float
    start_ticks: float
    utime_ticks: float
    stime_ticks: float
    open_fds: int | None
    max_fds: float | None


class OwnProcess:
    """Reads this process's figures; ``families`` turns a read into the exported ones."""

    def __init__(self, proc: str = PROC) -> None:
        self._proc = proc
        self._ticks = float(os.sysconf("SC_CLK_TCK"))
        self._pagesize = resource.getpagesize()
        self._btime = _boot_time(proc)

    def read(self) -> ProcessReading | None:
        """None where /proc cannot be read (no figures, as ProcessCollector gives)."""
        if not self._btime:
            return None
        try:
            fd = os.open(f"{self._proc}/self/stat", os.O_RDONLY | os.O_CLOEXEC)
            try:
                raw = os.read(fd, 4096)
            finally:
                os.close(fd)
        except OSError:
            return None
        parts = raw.split(b")")[-1].split()
        try:
            open_fds: int | None = len(os.listdir(f"{self._proc}/self/fd"))
            soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
            max_fds = None if soft == resource.RLIM_INFINITY else float(soft)
        except OSError:
            open_fds = max_fds = None
        return ProcessReading(float(parts[20]), float(parts[21]), float(parts[19]),
                              float(parts[11]), float(parts[12]), open_fds, max_fds)

    def families(self, reading: ProcessReading | None) -> list[Metric]:
        """The read as ProcessCollector's families: same names, help, types, values."""
        if reading is None:
            return []
        out: list[Metric] = [
            GaugeMetricFamily("process_virtual_memory_bytes", "Virtual memory size in bytes.",
                              value=reading.vmem),
            GaugeMetricFamily("process_resident_memory_bytes",
                              "Resident memory size in bytes.",
                              value=reading.rss_pages * self._pagesize),
            GaugeMetricFamily("process_start_time_seconds",
                              "Start time of the process since unix epoch in seconds.",
                              value=reading.start_ticks / self._ticks + self._btime),
            CounterMetricFamily("process_cpu_seconds_total",
                                "Total user and system CPU time spent in seconds.",
                                value=(reading.utime_ticks / self._ticks
                                       + reading.stime_ticks / self._ticks)),
        ]
        if reading.open_fds is not None and reading.max_fds is not None:
            out.append(GaugeMetricFamily("process_open_fds", "Number of open file descriptors.",
                                         reading.open_fds))
            out.append(GaugeMetricFamily("process_max_fds",
                                         "Maximum number of open file descriptors.",
                                         value=reading.max_fds))
        return out


def _boot_time(proc: str) -> float:
    """The boot time (``btime`` of /proc/stat), 0 where it cannot be read."""
    try:
        with open(f"{proc}/stat", "rb") as stat:
            for line in stat:
                if line.startswith(b"btime "):
                    return float(line.split()[1])
    except OSError:
        pass
    return 0.0
