"""What the driver's sample buffers did, per GPU: counted every time (a site sees it in
``slurm_gpu_driver_events_total``), logged the first time."""

from __future__ import annotations

import logging

from slurm_gpu_exporter.gpu.driver.clocks import clock_of
from slurm_gpu_exporter.gpu.driver.cursors import SampleCursor
from slurm_gpu_exporter.gpu.readings import DeviceReading, HostClocks

log = logging.getLogger("slurm_gpu_exporter.gpu.driver.integration")

# What the driver's samples did that a site may want to see, counted per GPU: a cursor
# moved back to the newest sample (its clock went back), a sample re-read a little
# older than before (not a clock step), the host clock of its samples changed, a
# sample over 100 % clamped, one outside 0..GARBAGE_PERCENT dropped, a read that came
# later than the buffer's span (gpu/driver/buffers.py).
EVENT_KINDS = ("device_rebase", "process_rebase", "stamp_jitter", "clock_change", "clamped",
               "out_of_range", "buffer_overrun")




class DriverEvents:
    """Counts of EVENT_KINDS by GPU, and which warnings were logged already."""

    def __init__(self) -> None:
        self.counts: dict[str, dict[str, int]] = {}  # uuid -> kind -> count
        self._warned: set[tuple[str, str]] = set()  # (uuid, what): logged once

    def count(self, uuid: str, kind: str) -> None:
        """One more event of ``kind`` (EVENT_KINDS) on a GPU."""
        per = self.counts.setdefault(uuid, {})
        per[kind] = per.get(kind, 0) + 1

    def note_clock(self, reading: DeviceReading, c: SampleCursor, newest_us: int,
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
            self.count(reading.uuid, "clock_change")
            log.info("GPU %d (%s): device samples are now stamped on CLOCK_%s (were on "
                     "CLOCK_%s)", reading.index, reading.uuid, clock.upper(),
                     c.device_clock.upper())
        c.device_clock = clock
        return clock

    def rebase(self, reading: DeviceReading, what: str, ahead_us: int) -> None:
        """Count a cursor rebase; the first of each GPU and kind is logged as a warning."""
        self.count(reading.uuid, f"{what}_rebase")
        if (reading.uuid, what) in self._warned:
            log.debug("GPU %s: %s sample cursor re-based again", reading.uuid, what)
            return
        self._warned.add((reading.uuid, what))
        log.warning("GPU %d (%s): the driver's %s sample clock went back %.0f s (a clock "
                    "step, a driver reload or another clock); counting resumes from its "
                    "newest sample", reading.index, reading.uuid, what, ahead_us / 1e6)

    def prune(self, present: set[str]) -> None:
        for uuid in [u for u in self.counts if u not in present]:
            del self.counts[uuid]
        self._warned = {w for w in self._warned if w[0] in present}
