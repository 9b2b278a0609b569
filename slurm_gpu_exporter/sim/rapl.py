"""The simulated node's CPU energy: a powercap tree of two sockets whose RAPL counters
move with the jobs' CPU use, and the ``/proc/stat`` busy time to share it by."""

from __future__ import annotations

from pathlib import Path

SOCKETS = 2
IDLE_W = 60.0  # per package
CORE_W = 4.0  # per busy core
DRAM_W = 9.0  # per socket
MAX_RANGE_UJ = 262_143_328_850
USER_HZ = 100


class SimulatedRapl:
    """Writes ``intel-rapl:<s>`` package and dram zones and the first line of /proc/stat."""

    def __init__(self, powercap_root: Path, proc_root: Path, cpus: int) -> None:
        self.root = powercap_root
        self.proc_root = proc_root
        self.cpus = cpus
        self._uj: dict[str, float] = {}
        self._busy_s = 0.0
        self._idle_s = 0.0
        for s in range(SOCKETS):
            self._zone(f"intel-rapl:{s}", f"package-{s}")
            self._zone(f"intel-rapl:{s}:0", "dram")
        self._write_stat()

    def _zone(self, name: str, label: str) -> None:
        d = self.root / name
        d.mkdir(parents=True, exist_ok=True)
        (d / "name").write_text(label + "\n")
        (d / "max_energy_range_uj").write_text(f"{MAX_RANGE_UJ}\n")
        self._uj[name] = 0.0
        (d / "energy_uj").write_text("0\n")

    def advance(self, seconds: float, busy_cores: float) -> float:
        """``seconds`` of time in which ``busy_cores`` cores (of the node) were busy; the
        watts the sockets drew."""
        busy_cores = min(float(self.cpus), max(0.0, busy_cores))
        self._busy_s += busy_cores * seconds
        self._idle_s += (self.cpus - busy_cores) * seconds
        for s in range(SOCKETS):
            package = IDLE_W + CORE_W * busy_cores / SOCKETS
            for name, watts in ((f"intel-rapl:{s}", package), (f"intel-rapl:{s}:0", DRAM_W)):
                self._uj[name] = (self._uj[name] + watts * seconds * 1e6) % MAX_RANGE_UJ
                (self.root / name / "energy_uj").write_text(f"{int(self._uj[name])}\n")
        self._write_stat()
        return SOCKETS * (IDLE_W + CORE_W * busy_cores / SOCKETS + DRAM_W)

    def _write_stat(self) -> None:
        user = int(self._busy_s * USER_HZ * 0.9)
        system = int(self._busy_s * USER_HZ) - user
        idle = int(self._idle_s * USER_HZ)
        (self.proc_root / "stat").write_text(f"cpu  {user} 0 {system} {idle} 0 0 0 0 0 0\n")
