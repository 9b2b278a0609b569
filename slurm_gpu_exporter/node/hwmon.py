"""The node's power from a meter the kernel shows under hwmon.

A hwmon device (``/sys/class/hwmon/hwmon<N>``) names its driver in ``name``; a power
meter shows ``power<K>_input`` (instantaneous) or ``power<K>_average`` (averaged over
the meter's own interval), both in microwatts. The ACPI power meter is the device named
``power_meter``; a site whose PSUs report through PMBus names those drivers instead.
Only the named devices are read: the CPU and GPU sensors other drivers show are parts
of the node, and adding them would count the same watts twice.

A meter that is absent, unreadable or vanishes raises ``MeterDown``: the caller reports
the source down, never a reading of zero.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from slurm_gpu_exporter.node.kernelfile import read_kernel_file

__all__ = ["DEFAULT_METERS", "HwmonPowerMeter", "MeterDown"]

DEFAULT_METERS = ("power_meter",)
REDISCOVER_READS = 60  # while no meter is found, look again this often
_POWER = re.compile(r"^power(\d+)_(input|average)$")


class MeterDown(Exception):
    """The node's power meter gave no reading; the message says why in one line.
    ``absent``: no meter was found (the same absence is worth counting once)."""

    def __init__(self, message: str, absent: bool = False) -> None:
        super().__init__(message)
        self.absent = absent


def find_power_files(root: Path, names: tuple[str, ...]) -> list[Path]:
    """Each named device's power files: ``power<K>_input`` where it has one, else
    ``power<K>_average`` (one file per channel K, so a channel is never read twice)."""
    try:
        devices = sorted(os.listdir(root))
    except OSError as exc:
        raise MeterDown(f"cannot list {root}: {exc.strerror}", absent=True) from None
    found: list[Path] = []
    problems: list[str] = []
    for device in devices:
        path = root / device
        try:
            name = read_kernel_file(path / "name").decode().strip()
            entries = os.listdir(path)
        except (OSError, UnicodeDecodeError) as exc:
            problems.append(f"{path}: {getattr(exc, 'strerror', None) or exc}")
            continue
        if name not in names:
            continue
        channels: dict[str, str] = {}
        for entry in entries:
            m = _POWER.match(entry)
            if m and (m.group(2) == "input" or m.group(1) not in channels):
                channels[m.group(1)] = entry
        found.extend(path / channels[k] for k in sorted(channels, key=int))
    if not found:
        seen = f" ({'; '.join(problems)})" if problems else ""
        raise MeterDown(f"no hwmon device named {' or '.join(names)} with a power reading "
                        f"under {root}{seen}", absent=True)
    return found


class HwmonPowerMeter:
    """The named hwmon devices' power, summed, in watts; looks for them again after a miss."""

    def __init__(self, root: Path, names: tuple[str, ...] = DEFAULT_METERS) -> None:
        self.root = root
        self.names = names
        self.files: list[Path] = []
        self._absent: MeterDown | None = None
        self._until_rediscover = 0

    def describe(self) -> str:
        return f"hwmon {','.join(self.names)} under {self.root}"

    def read(self) -> float:
        """Watts now; raises MeterDown. A file that vanished sends the next read looking
        for the devices again (a driver reloaded renumbers hwmon)."""
        if not self.files:
            self._until_rediscover -= 1
            if self._absent is not None and self._until_rediscover > 0:
                # A new exception each time: raising the stored one again would grow
                # its traceback by these frames on every read, without end.
                raise MeterDown(str(self._absent), absent=True)
            try:
                self.files = find_power_files(self.root, self.names)
                self._absent = None
            except MeterDown as exc:
                self._absent, self._until_rediscover = exc, REDISCOVER_READS
                raise
        total = 0.0
        for path in self.files:
            try:
                microwatts = int(read_kernel_file(path))
            except (OSError, ValueError) as exc:
                self.files = []
                raise MeterDown(f"cannot read {path}: "
                                f"{getattr(exc, 'strerror', None) or exc}") from None
            if microwatts < 0:
                raise MeterDown(f"{path} holds a negative power ({microwatts} uW)")
            total += microwatts / 1e6
        return total
