"""The driver's cumulative energy counters: joules between two readings of a GPU, with
the last reading kept in the state dir so that a restart of the agent loses none.

``nvmlDeviceGetTotalEnergyConsumption`` counts millijoules since the driver loaded, so
what a GPU used while the agent was down is the first reading after the restart less
the one saved before it: nothing is estimated. A saved reading is good for the same
GPU (UUID), boot and driver version, and only while the counter has not gone below
it: a reboot, a driver reload or upgrade, or a GPU reset restarts the counter, and
the energy then counts from the new reading (the time the agent was down is lost,
never counted twice or negative). A reload whose new counter has passed the saved
value by the time the agent reads it again looks like an unbroken counter: it counts
less than was used, never more.

Pure bookkeeping: the wall time of each reading comes in as an argument.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from slurm_gpu_exporter.gpu.attribution.cumulative import HeldReadings
from slurm_gpu_exporter.gpu.readings import DeviceReading
from slurm_gpu_exporter.node.state_dir import of_this_boot, stamp_boot

log = logging.getLogger(__name__)

STATE_KEY = "energy_readings"  # in the GPU part of the state file


@dataclass(frozen=True)
class EnergyReading:
    """One reading of a GPU's counter (mJ) and the wall time of the sample it was in."""

    mj: int
    at: float


@dataclass(frozen=True)
class EnergyDelta:
    """Joules a GPU used since the previous reading (None: the GPU has no counter).

    ``gap_from`` is set on the first reading after a restart that counts from the
    reading saved in the state dir: the wall time of that reading, where the time the
    agent was down began.
    """

    joules: float | None
    gap_from: float | None = None


def energy_delta_j(previous_mj: int | None, current_mj: int) -> float:
    """Joules between two readings of the driver's cumulative energy counter; 0 on the
    first look or when the counter went back (the driver reloaded)."""
    if previous_mj is None or current_mj < previous_mj:
        return 0.0
    return (current_mj - previous_mj) / 1000.0


class EnergyCounters(HeldReadings):
    """Per GPU (by UUID): the last energy reading, and the ones saved by the agent
    before a restart until each GPU's first reading has used its own."""

    def __init__(self) -> None:
        self.last: dict[str, EnergyReading] = {}
        self.restored: dict[str, EnergyReading] = {}  # from the state dir, not used yet
        self.restored_driver: str | None = None  # the driver the restored ones are of
        self.driver: str | None = None  # the driver this agent reads
        # GPUs a job held at their last reading: only theirs are saved, as only a job
        # can be owed the energy of a gap (and an idle node writes no state).
        self.held: set[str] = set()

    def driver_seen(self, driver: str | None) -> None:
        """The driver of this agent's readings; saved readings of another are dropped
        (a driver upgrade restarted its counters)."""
        self.driver = driver
        if self.restored and self.restored_driver not in (None, driver):
            log.info("the saved GPU energy readings are of driver %s, not %s; each GPU's "
                     "energy counts from its first reading", self.restored_driver, driver)
            self.restored.clear()

    def delta(self, reading: DeviceReading, now: float) -> EnergyDelta:
        """Joules since the previous reading of this GPU, taken in the sample at ``now``.

        A read that failed counts 0 now: the last good value is kept, so the next good
        read counts the energy used in between (the driver's counter is cumulative).
        """
        mj = reading.energy_mj
        if mj is None:
            return EnergyDelta(0.0 if "energy" in reading.failed else None)
        previous = self.last.get(reading.uuid)
        self.last[reading.uuid] = EnergyReading(mj, now)
        if previous is not None:
            return EnergyDelta(energy_delta_j(previous.mj, mj))
        saved = self.restored.pop(reading.uuid, None)
        if saved is None:
            return EnergyDelta(0.0)  # the first look: the counter's past is nobody's
        if mj < saved.mj:
            log.warning("GPU %d (%s): the driver's energy counter went back from %d to %d "
                        "mJ while the agent was down (a driver reload or GPU reset); its "
                        "energy counts from this reading, the time down is not counted",
                        reading.index, reading.uuid, saved.mj, mj)
            return EnergyDelta(0.0)
        return EnergyDelta(energy_delta_j(saved.mj, mj), gap_from=saved.at)

    def exported_mj(self, reading: DeviceReading) -> int | None:
        """The counter to export: after a failed read, the last good one."""
        if reading.energy_mj is None and "energy" in reading.failed:
            last = self.last.get(reading.uuid)
            return last.mj if last is not None else None
        return reading.energy_mj

    def export_state(self, boot_id: str | None) -> dict[str, Any]:
        """The state-dir form, a key of its own (an agent that does not know it reads the
        rest as before): per GPU ``[mJ, wall time]``, stamped with the boot and driver.
        Saved: the last reading of each GPU a job held, and the restored ones not used
        yet (NVML has not answered since the restart)."""
        keep = {**self.restored, **{u: r for u, r in self.last.items() if u in self.held}}
        by_gpu = {uuid: [r.mj, r.at] for uuid, r in keep.items()}
        return {STATE_KEY: stamp_boot(by_gpu, boot_id, self.driver or self.restored_driver)}

    def import_state(self, data: dict[str, Any], boot_id: str | None) -> None:
        """The readings saved in this boot; entries that cannot be read are left out."""
        by_gpu, self.restored_driver = of_this_boot(
            data.get(STATE_KEY), boot_id, "GPU energy readings",
            "each GPU's energy counts from its first reading")
        for uuid, raw in by_gpu.items():
            try:
                mj, at = raw
                reading = EnergyReading(int(mj), float(at))
            except (TypeError, ValueError):
                continue
            if isinstance(mj, int) and not isinstance(mj, bool) and mj >= 0:
                self.restored[str(uuid)] = reading
