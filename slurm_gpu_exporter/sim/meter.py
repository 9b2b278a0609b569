"""The simulated node's power meter: an ACPI ``power_meter`` hwmon device whose reading
is the node's other parts, its GPUs and its sockets' RAPL power."""

from __future__ import annotations

from pathlib import Path

OTHER_W = 250.0  # fans, disks, network, power-supply losses
GPU_W = 180.0  # per GPU: about what the simulated GPUs draw on average


class SimulatedMeter:
    """Writes ``hwmon0/power1_average`` (microwatts) under ``hwmon_root``."""

    def __init__(self, hwmon_root: Path, gpus: int) -> None:
        self.root = hwmon_root
        self.gpus = gpus
        device = hwmon_root / "hwmon0"
        device.mkdir(parents=True, exist_ok=True)
        (device / "name").write_text("power_meter\n")
        self.set(0.0)

    def set(self, rapl_watts: float) -> None:
        """The node's reading with the sockets drawing ``rapl_watts``."""
        watts = OTHER_W + GPU_W * self.gpus + rapl_watts
        path = self.root / "hwmon0" / "power1_average"
        tmp = path.with_suffix(".tmp")  # the agent never reads half a number
        tmp.write_text(f"{round(watts * 1e6)}\n")
        tmp.replace(path)
