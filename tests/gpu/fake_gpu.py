"""A small in-process GpuBackend for the GPU unit tests, whose clock the test drives.

One GPU (minor 0) with driver samples every 100 ms at ``percent`` and a cumulative
energy counter. ``hang`` makes reads block until it is cleared (a hung NVML call).
The C fake library (tests/fakenvml) stands in for NVML in the integration tests.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from slurm_gpu_exporter.gpu.readings import (
    DeviceReading,
    GpmFigures,
    GpuProcess,
    HealthReading,
    UtilSample,
    XidEvent,
)
from slurm_gpu_exporter.node.procfs import PidJob

T0 = 1_800_000_000.0
STEP_US = 100_000
BUFFER_US = 20_000_000


class FakeBackend:
    """One GPU; ``fail`` names fields whose next read fails once (then they work)."""

    def __init__(self) -> None:
        self.uuid = "GPU-aaaa"
        self.t = T0  # the wall clock; the driver's is ``t + clock_offset_s``
        self.clock_offset_s = 0.0
        self.percent = 50.0
        self.energy_mj: int | None = 5_000_000
        self.processes: tuple[GpuProcess, ...] = ()
        self.fail: set[str] = set()
        self.no_samples = False  # the driver answers NOT_FOUND (an idle GPU, say)
        self.lost_before = 0.0  # driver time before which samples were lost
        self._stop = threading.Event()
        self.hang = threading.Event()  # set: reads block until it is cleared
        self.init_error: Exception | None = None  # raised by init() while set
        self.read_error: Exception | None = None  # raised by read() while set
        self.xids: list[XidEvent] = []  # handed out by the next wait_xid
        self.inits = self.shutdowns = 0
        # GPM: None = no GPM on this GPU; else the SM activity fraction. Figures cover
        # the time since the previous read that got them ("gpm" in ``fail``: none).
        self.sm_active: float | None = None
        self._gpm_since: float | None = None
        # Violation counters (ns) of the reasons the GPU supports, and the share of the
        # time each is active (advance() moves them); device error counters by key.
        self.violations_ns: dict[str, int] = {}
        self.throttling: dict[str, float] = {}
        self.error_counters: dict[str, int] = {}
        self.ecc_corrected: int | None = None

    def init(self) -> str:
        self.inits += 1
        if self.init_error is not None:
            raise self.init_error
        self._stop.clear()
        return "test"

    def shutdown(self) -> None:
        self.shutdowns += 1
        self._stop.set()

    def wait_xid(self, timeout_ms: int) -> list[XidEvent]:
        self._stop.wait(min(timeout_ms / 1000, 0.02))
        events, self.xids = self.xids, []
        return events

    def advance(self, seconds: float, watts: float = 100.0) -> None:
        self.t += seconds
        for reason, share in self.throttling.items():
            self.violations_ns[reason] += round(share * seconds * 1e9)
        if self.energy_mj is not None:
            self.energy_mj += round(watts * seconds * 1000)

    def read(self, cursors: dict[str, tuple[int, int]]) -> list[DeviceReading]:
        while self.hang.is_set():
            self.hang.wait(0.01)  # hung until the test clears it
        if self.read_error is not None:
            raise self.read_error
        fail, self.fail = self.fail, set()
        samples: tuple[UtilSample, ...] = ()
        if not self.no_samples and "utilization samples" not in fail:
            now_us = round((self.t + self.clock_offset_s) * 1e6)
            floor = max(cursors.get(self.uuid, (0, 0))[0], now_us - BUFFER_US,
                        round(self.lost_before * 1e6))
            first = floor // STEP_US * STEP_US + STEP_US
            samples = tuple(UtilSample(ts, self.percent)
                            for ts in range(first, now_us + 1, STEP_US))
        return [DeviceReading(
            index=0, uuid=self.uuid, name="fake", minor=0, pci_bus_id="",
            gpm_supported=self.sm_active is not None, gpm=self._gpm(fail),
            energy_mj=None if "energy" in fail else self.energy_mj,
            processes=self.processes, util_samples=samples, process_samples=(),
            ecc_corrected=self.ecc_corrected,
            health=HealthReading(
                violations_ns=tuple(v for v in self.violations_ns.items() if v[0] not in fail),
                counters=tuple(self.error_counters.items()), sm_clock_mhz=1980,
                sm_clock_max_mhz=1980) if self.violations_ns or self.error_counters else None,
            errors=tuple(f"{f}: Unknown Error" for f in sorted(fail)),
            failed=frozenset(fail),
        )]


    def _gpm(self, fail: set[str]) -> GpmFigures | None:
        if self.sm_active is None or "gpm" in fail:
            return None  # a failed read keeps the previous GPM sample, as gpu/nvml/gpm.py does
        since, self._gpm_since = self._gpm_since, self.t
        if since is None:
            return None
        return GpmFigures(self.t - since, {"sm_active": self.sm_active},
                          {"pcie_transmit": 1000.0})


@dataclass
class StubMapper:
    """pid -> job id, standing in for the /proc and cgroup look-up."""

    jobs: dict[int, str]

    def job_of(self, pid: int) -> PidJob | None:
        jobid = self.jobs.get(pid)
        return PidJob(jobid, None, False, "cgroup") if jobid else None


