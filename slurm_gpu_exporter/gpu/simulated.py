"""Simulated GPUs for ``--simulate``: processes on GPUs, seen as NVML would see them.

The backend is given the GPU count and a callable that tells which processes run
on which GPU, and how busy, at a given wall time (``--simulate`` passes its demo
node's). Samples come on a fixed driver-like grid (six per second) from it, so
busy counters and utilization ratios behave as they do on real GPUs. The GPUs have
GPM (they are H100s): each read after the first gives GPM means since the previous
one, derived from the busy share (a busy H100 rarely has every SM active).
"""

from __future__ import annotations

import math
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import Protocol

from slurm_gpu_exporter.gpu.readings import (
    DeviceReading,
    GpmFigures,
    GpuProcess,
    HealthReading,
    ProcessUtilSample,
    UtilSample,
    XidEvent,
)

SAMPLE_PERIOD_US = 166_667
BUFFER_US = 20_000_000
IDLE_WATTS = 70.0
BUSY_WATTS = 700.0
NAME = "NVIDIA H100 80GB HBM3"
GPU_MEMORY = 80 * 2**30
# GPM activity as a share of the busy share, and PCIe bytes/s when fully busy.
GPM_SHARES = {"sm_active": 0.7, "sm_occupancy": 0.45, "tensor_active": 0.35,
              "dram_active": 0.5, "fp32_active": 0.1, "fp16_active": 0.2, "fp64_active": 0.0}
PCIE_BUSY = 2.0e9
# Throttling: a GPU busy above POWER_KNEE percent is power-capped a growing share of the
# time (POWER_CAPPED at 100 %), the last GPU runs warm (thermal slowdown a few percent of
# its busy time); the SM clock drops with the capped share. Other reasons: supported, 0.
POWER_KNEE, POWER_CAPPED, WARM_SHARE = 80.0, 0.25, 0.04
SM_MAX_MHZ, SM_CAPPED_MHZ = 1980, 1590


class SimulatedProcess(Protocol):
    """A process on a simulated GPU at a given time, with its SM use."""

    @property
    def gpu(self) -> int: ...
    @property
    def pid(self) -> int: ...
    @property
    def used_memory(self) -> int: ...
    @property
    def sm_percent(self) -> float: ...


ProcessesAt = Callable[[float], Iterable[SimulatedProcess]]  # wall time -> processes


def _uuid(index: int) -> str:
    return f"GPU-5e1a{index:04x}-7c3d-4f2e-9b8a-00000000{index:04x}"


class SimulatedBackend:
    """GpuBackend over ``gpu_count`` GPUs running what ``processes`` says at each time.

    ``clock`` is the wall clock the driver stamps its samples with.
    """

    def __init__(self, gpu_count: int, processes: ProcessesAt, *,
                 gpu_memory: int = GPU_MEMORY, clock: Callable[[], float] = time.time) -> None:
        self.gpu_count = gpu_count
        self.processes = processes
        self.gpu_memory = gpu_memory
        self._clock = clock
        self._energy_mj = [5.0e9 + 1.0e8 * i for i in range(gpu_count)]
        self._energy_at = clock()
        self._violations_ns = [{"power": 0.0, "thermal": 0.0, "sync_boost": 0.0,
                                "board_limit": 0.0, "reliability": 0.0}
                               for _ in range(gpu_count)]
        self._capped = [0.0] * gpu_count  # the power-capped share of the last interval
        self._gpm_at: float | None = None  # time of the previous read (GPM interval start)
        self._stop = threading.Event()

    def init(self) -> str:
        return "550.54.15 (simulated)"

    def shutdown(self) -> None:
        self._stop.set()

    def wait_xid(self, timeout_ms: int) -> list[XidEvent]:
        self._stop.wait(timeout_ms / 1000)
        return []

    def read(self, cursors: dict[str, tuple[int, int]]) -> list[DeviceReading]:
        now_us = int(self._clock() * 1e6)
        oldest = min((c[0] for c in cursors.values() if c[0]), default=now_us - BUFFER_US)
        start = max(oldest, now_us - BUFFER_US) // SAMPLE_PERIOD_US * SAMPLE_PERIOD_US
        util: dict[int, list[UtilSample]] = defaultdict(list)
        proc_samples: dict[int, list[ProcessUtilSample]] = defaultdict(list)
        for t_us in range(start + SAMPLE_PERIOD_US, now_us + 1, SAMPLE_PERIOD_US):
            per_gpu: dict[int, float] = defaultdict(float)
            for proc in self._processes_at(t_us / 1e6):
                per_gpu[proc.gpu] += proc.sm_percent
                if proc.sm_percent > 0:
                    proc_samples[proc.gpu].append(
                        ProcessUtilSample(proc.pid, t_us, proc.sm_percent))
            for gpu in range(self.gpu_count):
                util[gpu].append(UtilSample(t_us, min(100.0, per_gpu[gpu])))
        current = self._processes_at(now_us / 1e6)
        self._advance_energy(now_us / 1e6, util)
        gpm_since, self._gpm_at = self._gpm_at, now_us / 1e6
        readings = []
        for gpu in range(self.gpu_count):
            uuid = _uuid(gpu)
            dev_cursor, proc_cursor = cursors.get(uuid, (0, 0))
            procs = tuple(GpuProcess(p.pid, p.used_memory) for p in current if p.gpu == gpu)
            last_util = util[gpu][-1].percent if util[gpu] else 0.0
            readings.append(DeviceReading(
                index=gpu, uuid=uuid, name=NAME, minor=gpu,
                pci_bus_id=f"00000000:{0x18 + 0x10 * gpu:02X}:00.0",
                memory_used=sum(p.used_memory or 0 for p in procs) + 500 * 2**20,
                memory_total=self.gpu_memory,
                power_watts=IDLE_WATTS + (BUSY_WATTS - IDLE_WATTS) * last_util / 100,
                energy_mj=int(self._energy_mj[gpu]),
                temperature_c=round(32 + 0.45 * last_util + math.sin(now_us / 6e7 + gpu), 1),
                ecc_corrected=gpu // 3, ecc_uncorrected=0,
                processes=procs,
                util_samples=tuple(s for s in util[gpu] if s.timestamp_us > dev_cursor),
                process_samples=tuple(s for s in proc_samples[gpu]
                                      if s.timestamp_us > proc_cursor),
                gpm_supported=True,
                gpm=_gpm(util[gpu], gpm_since, now_us / 1e6),
                health=HealthReading(
                    violations_ns=tuple((r, int(ns)) for r, ns in self._violations_ns[gpu].items()),
                    counters=(("remapped_rows:correctable", 0),
                              ("remapped_rows:uncorrectable", 0), ("pcie_replays", gpu % 2)),
                    sm_clock_mhz=round(SM_MAX_MHZ - (SM_MAX_MHZ - SM_CAPPED_MHZ)
                                       * self._capped[gpu] / POWER_CAPPED),
                    sm_clock_max_mhz=SM_MAX_MHZ),
            ))
        return readings

    def _processes_at(self, now: float) -> list[SimulatedProcess]:
        return list(self.processes(now))

    def _advance_energy(self, now: float, util: dict[int, list[UtilSample]]) -> None:
        elapsed = max(0.0, now - self._energy_at)
        self._energy_at = now
        for gpu in range(self.gpu_count):
            samples = util[gpu]
            mean = sum(s.percent for s in samples) / len(samples) if samples else 0.0
            watts = IDLE_WATTS + (BUSY_WATTS - IDLE_WATTS) * mean / 100
            self._energy_mj[gpu] += watts * elapsed * 1000
            capped = POWER_CAPPED * max(0.0, mean - POWER_KNEE) / (100 - POWER_KNEE)
            self._capped[gpu] = capped
            self._violations_ns[gpu]["power"] += capped * elapsed * 1e9
            if gpu == self.gpu_count - 1:
                self._violations_ns[gpu]["thermal"] += WARM_SHARE * mean / 100 * elapsed * 1e9


def _gpm(samples: list[UtilSample], since: float | None, now: float) -> GpmFigures | None:
    """GPM means since the previous read, from the busy share of the samples in between."""
    if since is None or now <= since:
        return None
    inside = [s.percent for s in samples if s.timestamp_us > since * 1e6]
    busy = sum(inside) / len(inside) / 100 if inside else 0.0
    return GpmFigures(now - since, {k: busy * share for k, share in GPM_SHARES.items()},
                      {"pcie_transmit": busy * PCIE_BUSY, "pcie_receive": busy * PCIE_BUSY / 4})
