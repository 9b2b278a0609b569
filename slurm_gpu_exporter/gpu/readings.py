"""The plain data a GPU backend returns, and the host's clocks its samples are read
against: the bottom of gpu/, which every other part of it reads and which imports
none of them. The backend protocol is gpu/backend.py; what the driver's clocks are
and how to convert between them, gpu/driver/clocks.py.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass

# The host clocks a driver may stamp its samples on (gpu/driver/clocks.py finds which).
REALTIME, BOOTTIME, MONOTONIC = "realtime", "boottime", "monotonic"


@dataclass(frozen=True)
class HostClocks:
    """The host's clocks read at one instant (seconds); None: not read."""

    realtime: float
    boottime: float | None = None
    monotonic: float | None = None

    @classmethod
    def now(cls) -> HostClocks:
        """All three clocks, read back to back."""
        return cls(time.clock_gettime(time.CLOCK_REALTIME),
                   time.clock_gettime(time.CLOCK_BOOTTIME),
                   time.clock_gettime(time.CLOCK_MONOTONIC))

    def of(self, clock: str) -> float | None:
        """The reading of one clock by name (REALTIME, BOOTTIME, MONOTONIC)."""
        return {REALTIME: self.realtime, BOOTTIME: self.boottime,
                MONOTONIC: self.monotonic}.get(clock)


@dataclass(frozen=True)
class GpmFigures:
    """NVML GPM means over one interval between two GPM samples of a GPU or MIG instance.

    ``seconds`` is the interval (the agent's clock); ``activity`` holds fractions
    0..1 ("sm_active", "tensor_active", ...), ``traffic`` bytes per second
    ("pcie_transmit", ...). A metric the GPU could not give this time is absent.
    """

    seconds: float
    activity: Mapping[str, float]
    traffic: Mapping[str, float]


@dataclass(frozen=True)
class MigInstance:
    """A MIG instance of a GPU, as NVML lists it; ``gpm`` as for DeviceReading."""

    gpu_instance_id: int
    compute_instance_id: int
    uuid: str
    name: str
    memory_total: int | None
    memory_used: int | None
    gpm: GpmFigures | None = None


@dataclass(frozen=True)
class GpuProcess:
    """A process using a GPU; the instance ids are set on a MIG-enabled GPU."""

    pid: int
    used_memory: int | None
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None


@dataclass(frozen=True)
class UtilSample:
    """One driver utilization sample: the percent busy over the period ending at timestamp_us."""

    timestamp_us: int
    percent: float


@dataclass(frozen=True)
class ProcessUtilSample:
    """One driver sample of a process's SM utilization."""

    pid: int
    timestamp_us: int
    sm_percent: float


@dataclass(frozen=True)
class BufferShape:
    """What a read of a GPU's whole device-sample buffer found: how many samples it
    holds and the oldest one's timestamp (None: it holds none)."""

    held: int
    oldest_us: int | None


@dataclass(frozen=True)
class HealthReading:
    """What slows a GPU down or breaks it, as the driver counts it (gpu/nvml/health.py).

    ``violations_ns``: the cumulative nanoseconds each reason (gpu/throttle.REASONS) held
    the clocks down, only for the reasons the GPU supports; ``counters``: cumulative
    device error counters by key ("remapped_rows:correctable", "pcie_replays",
    "nvlink:crc_flit", ...), only those the GPU has; a counter whose read failed this time
    is left out (its last value stands). Clocks in MHz, None: not readable.
    """

    violations_ns: tuple[tuple[str, int], ...] = ()
    counters: tuple[tuple[str, int], ...] = ()
    sm_clock_mhz: int | None = None
    sm_clock_max_mhz: int | None = None
    # The current clocks-event reasons (nvmlClocksEventReason* bits) and those the GPU can
    # report; read only where it has no violation counter at all (gpu/attribution/throttle.py then
    # samples the bitmask).
    clocks_event_reasons: int | None = None
    clocks_event_reasons_supported: int | None = None


@dataclass(frozen=True)
class DeviceReading:
    """One poll of one physical GPU. None means "not supported or not readable" for that field.

    ``util_samples`` holds the device samples newer than the cursor passed in (empty
    when there are none yet; None when the GPU has no utilization samples, e.g. MIG).
    Where a call found none newer than a cursor, ``util_buffer_newest_us`` /
    ``process_buffer_newest_us`` hold the newest timestamp the driver still has (None:
    its buffer is empty), so a cursor ahead of the driver's clock shows;
    ``util_buffer`` what the whole device buffer held (None: not read whole). ``clocks``
    are the host's clocks read right after the sample calls (None: not read; the
    sampler then takes its own wall time).
    ``gpm_supported`` says whether the GPU has NVML GPM (Hopper and later); ``gpm``
    holds the GPM means since the previous poll's GPM sample (None on the first
    poll, after a failed GPM read, or without GPM).
    """

    index: int
    uuid: str
    name: str
    minor: int | None
    pci_bus_id: str
    lost: bool = False
    memory_used: int | None = None
    memory_total: int | None = None
    power_watts: float | None = None
    energy_mj: int | None = None
    temperature_c: float | None = None
    ecc_corrected: int | None = None
    ecc_uncorrected: int | None = None
    processes: tuple[GpuProcess, ...] = ()
    util_samples: tuple[UtilSample, ...] | None = None
    process_samples: tuple[ProcessUtilSample, ...] | None = None
    util_buffer_newest_us: int | None = None
    process_buffer_newest_us: int | None = None
    util_buffer: BufferShape | None = None
    clocks: HostClocks | None = None
    mig: tuple[MigInstance, ...] = ()
    gpm_supported: bool = False
    gpm: GpmFigures | None = None
    health: HealthReading | None = None  # throttling and error counters (None: not read)
    errors: tuple[str, ...] = ()  # calls that failed in an unexpected way, for the log
    # Fields whose read failed this time ("energy", ...): their None means "unknown
    # now", not "not supported", so counters built on them must not restart.
    failed: frozenset[str] = frozenset()


@dataclass(frozen=True)
class BufferRead:
    """One read of a GPU's sample buffers between two samples (gpu/driver/buffers.py): the
    samples newer than the cursors passed in; None where the GPU has none; and what the
    whole device buffer held (None: not read whole)."""

    uuid: str
    util_samples: tuple[UtilSample, ...] | None = None
    process_samples: tuple[ProcessUtilSample, ...] | None = None
    util_buffer: BufferShape | None = None


@dataclass(frozen=True)
class XidEvent:
    uuid: str
    xid: int
    at: float = 0.0  # wall time it was seen (0: when the agent counts it)
