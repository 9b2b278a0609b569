"""A synthetic sysfs-like powercap (RAPL) tree for tests."""

from __future__ import annotations

from pathlib import Path

MAX_RANGE = 262143328850  # what Intel packages report


class PowercapTree:
    """A sysfs-like powercap tree: intel-rapl:<s> packages with a dram sub-zone."""

    def __init__(self, root: Path, sockets: int = 2, max_range: int = MAX_RANGE) -> None:
        self.root = root
        for s in range(sockets):
            self._zone(f"intel-rapl:{s}", f"package-{s}", max_range)
            self._zone(f"intel-rapl:{s}:0", "dram", max_range)
            self._zone(f"intel-rapl:{s}:1", "core", max_range)  # part of the package: unread
        self._zone("intel-rapl-mmio:0", "package-0", max_range)  # a duplicate view: unread

    def _zone(self, name: str, label: str, max_range: int) -> None:
        d = self.root / name
        d.mkdir(parents=True)
        (d / "name").write_text(label + "\n")
        (d / "max_energy_range_uj").write_text(f"{max_range}\n")
        (d / "energy_uj").write_text("0\n")

    def set(self, zone: str, uj: int) -> None:
        (self.root / zone / "energy_uj").write_text(f"{uj}\n")

    def get(self, zone: str) -> int:
        return int((self.root / zone / "energy_uj").read_text())
