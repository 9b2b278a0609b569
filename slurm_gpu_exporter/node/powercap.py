"""CPU package and DRAM energy from the kernel's powercap (RAPL) zones, and the node's
busy CPU time from ``/proc/stat`` to share it by.

Intel's ``intel-rapl:<socket>`` zones (and AMD's, which the kernel shows under the same
``intel-rapl`` driver, or ``amd-rapl`` on some kernels) hold a package counter
``energy_uj`` and, below it, ``intel-rapl:<socket>:<n>`` sub-zones named ``dram``,
``core``, ``uncore``. Only ``package`` and ``dram`` are read: core and uncore are parts
of the package. The counters wrap at ``max_energy_range_uj``; a read that went down
wrapped once (a sample interval is far shorter than a wrap, minutes at full power).

``energy_uj`` is root-only on kernels since 5.10 (CVE-2020-8694): an agent that cannot
read it, or a node without zones, gets ``down`` readings, never zeros.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from slurm_gpu_exporter.node.kernelfile import read_kernel_file

__all__ = ["PowercapReader", "RaplZone", "ZoneReading", "busy_cpu_seconds"]

_ZONE = re.compile(r"^(?:intel|amd)-rapl:(\d+)(?::(\d+))?$")
DOMAINS = ("package", "dram")


@dataclass(frozen=True)
class RaplZone:
    """One counter: a socket's package or its DRAM."""

    path: str  # the zone's directory
    socket: str
    domain: str  # "package" or "dram"
    max_range_uj: int


@dataclass(frozen=True)
class ZoneReading:
    """The energy a zone counted since the last read (None on the first read or a failure)."""

    zone: RaplZone
    joules: float | None
    error: str = ""


def discover(root: Path) -> tuple[list[RaplZone], list[str]]:
    """The package and DRAM zones under ``root`` and the problems met finding them."""
    zones: list[RaplZone] = []
    problems: list[str] = []
    try:
        names = sorted(os.listdir(root))
    except OSError as exc:
        return [], [f"cannot list {root}: {exc.strerror}"]
    for name in names:
        m = _ZONE.match(name)
        if m is None:
            continue
        path = root / name
        try:
            label = read_kernel_file(path / "name").decode().strip()
        except (OSError, UnicodeDecodeError) as exc:
            problems.append(f"cannot read {path}/name: {getattr(exc, 'strerror', exc)}")
            continue
        domain = "package" if label.startswith("package") else label
        if domain not in DOMAINS or (domain == "package") != (m.group(2) is None):
            continue
        try:
            max_range = int(read_kernel_file(path / "max_energy_range_uj"))
        except (OSError, ValueError) as exc:
            problems.append(f"cannot read {path}/max_energy_range_uj: "
                            f"{getattr(exc, 'strerror', exc)}")
            continue
        zones.append(RaplZone(str(path), m.group(1), domain, max_range))
    return zones, problems


class PowercapReader:
    """Reads each zone's ``energy_uj`` once per sample; the deltas, wrap-around undone."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.zones: list[RaplZone] = []
        self._last: dict[str, int] = {}  # zone path -> last energy_uj

    def rediscover(self) -> list[str]:
        """Find the zones again (at start, and while none was found); the problems met."""
        self.zones, problems = discover(self.root)
        if not self.zones and not problems:
            problems = [f"no RAPL package or DRAM zone under {self.root}"]
        return problems

    def read(self) -> list[ZoneReading]:
        readings = []
        for zone in self.zones:
            try:
                now = int(read_kernel_file(zone.path + "/energy_uj"))
            except (OSError, ValueError) as exc:
                self._last.pop(zone.path, None)  # start again from the next good read
                readings.append(ZoneReading(zone, None, f"cannot read {zone.path}/energy_uj: "
                                            f"{getattr(exc, 'strerror', None) or exc}"))
                continue
            last = self._last.get(zone.path)
            self._last[zone.path] = now
            readings.append(ZoneReading(zone, None if last is None else
                                        wrapped_delta(last, now, zone.max_range_uj) / 1e6))
        return readings


def wrapped_delta(last: int, now: int, max_range: int) -> int:
    """Micro-joules from ``last`` to ``now`` of a counter that wraps at ``max_range``."""
    return now - last if now >= last else now + max_range - last


def busy_cpu_seconds(proc_root: Path, user_hz: int | None = None) -> float:
    """CPU seconds every CPU of the node spent not idle (first line of ``/proc/stat``)."""
    with open(proc_root / "stat", "rb") as f:
        first = f.readline().split()
    if not first or first[0] != b"cpu":
        raise ValueError(f"{proc_root}/stat does not start with the cpu line")
    ticks = [int(v) for v in first[1:9]]
    busy = sum(ticks) - ticks[3] - ticks[4]  # less idle and iowait
    hz = user_hz or os.sysconf("SC_CLK_TCK")
    return busy / hz
