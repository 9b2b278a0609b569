"""Deltas of a GPU's cumulative driver counters between two readings, with the last reading
kept in the state dir so that a restart of the agent loses nothing (as energy.py does
for energy): violation nanoseconds by reason, remapped rows, PCIe replays, NVLink errors.

A saved reading is good for the same GPU (UUID), boot and driver version; a counter
below its last value restarted (driver reload, GPU reset, counters cleared): it counts
from the new value, never negative and never twice. A counter whose read failed keeps
its last value, so the next good read counts what was missed. Pure bookkeeping: the
wall time of each reading comes in as an argument.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from slurm_gpu_exporter.node.state_dir import of_this_boot, stamp_boot

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Reading:
    """The last values of one GPU's counters and the wall time of their sample."""

    values: Mapping[str, int]
    at: float


@dataclass(frozen=True)
class Delta:
    """What each counter added since the previous reading (only the counters read now).

    ``gap_from``: the wall time of the reading saved before a restart that this delta
    counts from (the time the agent was down began); None otherwise.
    """

    values: Mapping[str, int]
    gap_from: float | None = None


class HeldReadings:
    """The last and restored readings of each GPU's driver counter, and which GPUs a job
    held (only their readings are saved): what energy and the other cumulative counters
    keep alike."""

    last: dict[str, Any]
    restored: dict[str, Any]
    held: set[str]

    def hold(self, uuid: str, held: bool) -> None:
        """Whether a job held the GPU at its last reading (its reading is then saved)."""
        if held:
            self.held.add(uuid)
        else:
            self.held.discard(uuid)

    def prune(self, present: set[str]) -> None:
        """Forget GPUs no longer present."""
        for cache in (self.last, self.restored):
            for uuid in [u for u in cache if u not in present]:
                del cache[uuid]
        self.held &= present


class CumulativeReadings(HeldReadings):
    """Per GPU (by UUID): the last reading of a set of cumulative counters; the ones the
    agent saved before a restart until each GPU's first reading has used its own."""

    def __init__(self, state_key: str, what: str) -> None:
        self.state_key = state_key  # its own key in the GPU part of the state file
        self.what = what  # for the log: "GPU throttle counters", ...
        self.last: dict[str, Reading] = {}
        self.restored: dict[str, Reading] = {}
        self.restored_driver: str | None = None
        self.driver: str | None = None
        self.held: set[str] = set()  # GPUs a job held at their last reading: saved

    def driver_seen(self, driver: str | None) -> None:
        """The driver this agent reads; saved readings of another are dropped (an
        upgrade restarted the counters)."""
        self.driver = driver
        if self.restored and self.restored_driver not in (None, driver):
            log.info("the saved %s are of driver %s, not %s; they count from each GPU's "
                     "first reading", self.what, self.restored_driver, driver)
            self.restored.clear()

    def delta(self, uuid: str, values: Mapping[str, int], now: float) -> Delta:
        """What each counter in ``values`` added since the last reading of the GPU."""
        previous = self.last.get(uuid)
        gap_from = None
        if previous is None:
            previous = self.restored.pop(uuid, None)
            gap_from = previous.at if previous is not None else None
        base = previous.values if previous is not None else {}
        out = {}
        for name, value in values.items():
            before = base.get(name)
            if before is not None and value < before:
                log.info("GPU %s: the %s counter %s went back from %d to %d (driver reload, "
                         "GPU reset); it counts from there", uuid, self.what, name, before,
                         value)
            out[name] = value - before if before is not None and value >= before else 0
        self.last[uuid] = Reading({**base, **values}, now)
        return Delta(out, gap_from)

    def export_state(self, boot_id: str | None) -> dict[str, Any]:
        """Per GPU ``[{name: value}, wall time]``, stamped with the boot and driver: the
        last reading of each GPU a job held, and the restored ones not used yet."""
        keep = {**self.restored, **{u: r for u, r in self.last.items() if u in self.held}}
        by_gpu = {uuid: [dict(r.values), r.at] for uuid, r in keep.items()}
        return {self.state_key: stamp_boot(by_gpu, boot_id, self.driver or self.restored_driver)}

    def import_state(self, data: dict[str, Any], boot_id: str | None) -> None:
        """The readings saved in this boot; entries that cannot be read are left out."""
        by_gpu, self.restored_driver = of_this_boot(
            data.get(self.state_key), boot_id, self.what, "they count from each GPU's "
            "first reading")
        for uuid, raw in by_gpu.items():
            try:
                values, at = raw
                reading = Reading({str(k): int(v) for k, v in dict(values).items()
                                   if isinstance(v, int) and not isinstance(v, bool) and v >= 0},
                                  float(at))
            except (TypeError, ValueError):
                continue
            self.restored[str(uuid)] = reading
