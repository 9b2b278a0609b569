"""Per GPU, what the driver's sample stream leaves between polls: the cursors into the
driver's sample buffers, busy and unknown-time totals, counts of what the driver's
samples did (gpu/driver/events.py), what reads between two polls found
(gpu/driver/buffers.py), and what of it the state dir keeps. The samples themselves are
integrated by gpu/driver/integration.py's DeviceIntegrator, which stands on this.
"""

from __future__ import annotations

from typing import Any

from slurm_gpu_exporter.gpu.driver.buffers import BufferReads
from slurm_gpu_exporter.gpu.driver.cursors import SampleCursor
from slurm_gpu_exporter.gpu.driver.events import DriverEvents
from slurm_gpu_exporter.gpu.readings import BufferRead, HostClocks


class DeviceBook:
    """Per GPU: the cursors into the driver's sample buffers, busy and unknown-time
    totals, counts of what the driver's samples did, and what reads between two polls
    found; GPUs no longer present are forgotten, and the state dir keeps the rest."""

    def __init__(self) -> None:
        self.cursors: dict[str, SampleCursor] = {}
        self.device_busy: dict[str, float] = {}
        self.device_unknown: dict[str, float] = {}  # uuid -> seconds left out as unknown
        self.events = DriverEvents()
        self.buffers = BufferReads()
        self.restored_driver: str | None = None  # the driver the saved cursors are of
        self._generation = 0  # the backend init the cursors belong to

    def driver_cursors(self) -> dict[str, tuple[int, int]]:
        """The ``lastSeenTimeStamp`` values to read each GPU from: (device, process), past
        what reads between two polls stashed."""
        return {uuid: (c.device_us, c.process_last_seen()) for uuid, c in self.cursors.items()
                } | self.buffers.cursors(self.cursors)

    def keep_reads(self, reads: list[BufferRead], at: HostClocks) -> None:
        """Reads of the sample buffers between two polls, for the next poll to count."""
        for uuid in self.buffers.keep(reads, self.cursors, at):
            self.events.count(uuid, "buffer_overrun")

    def read_interval(self) -> float | None:
        """Seconds between reads of the sample buffers (None: no GPU has any)."""
        return self.buffers.read_interval(self.cursors)

    def prune(self, present: set[str]) -> None:
        """Forget GPUs no longer present (a MIG layout changed, a GPU was removed)."""
        self.events.prune(present)
        self.buffers.prune(present)
        for cache in (self.cursors, self.device_busy, self.device_unknown):
            for uuid in [u for u in cache if u not in present]:
                del cache[uuid]

    def export_state(self) -> dict[str, Any]:
        """Busy totals and the cursors' content (state.py stamps the boot and driver)."""
        return {"cursors_by_gpu": {uuid: c.to_state() for uuid, c in self.cursors.items()},
                "device_busy": dict(self.device_busy),
                "device_unknown": dict(self.device_unknown)}

    def import_state(self, data: dict[str, Any], cursors: dict[str, Any],
                     driver: str | None = None) -> None:
        """Busy totals from ``data``; ``cursors`` the saved cursors of this boot by GPU,
        read from ``driver``."""
        self.restored_driver = driver
        for uuid, raw in cursors.items():
            cursor = SampleCursor.from_state(raw)
            if cursor is not None:
                self.cursors[str(uuid)] = cursor
        for totals, key in ((self.device_busy, "device_busy"),
                            (self.device_unknown, "device_unknown")):
            for uuid, seconds in (data.get(key) or {}).items():
                if isinstance(seconds, int | float):
                    totals[uuid] = float(seconds)
