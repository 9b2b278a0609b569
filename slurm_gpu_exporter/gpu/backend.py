"""The GPU backend protocol and the plain data it returns.

A backend answers "what does each GPU look like right now": devices, MIG
instances, processes, and the driver's utilization samples newer than a given
timestamp. It keeps no counters; the GPU sampler integrates. Implementations:
``nvml.py`` (the real driver through nvidia-ml-py) and ``simulated.py``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from slurm_gpu_exporter.gpu.driver.clocks import HostClocks


class GpuUnavailable(Exception):
    """No GPU library or driver (or it failed to initialise); the message says which."""


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


class GpuBackend(Protocol):
    """What the GPU sampler needs from a driver; called from one thread at a time,
    except ``wait_xid`` which runs in its own thread."""

    def init(self) -> str:
        """Initialise; returns the driver version. Raises GpuUnavailable."""
        ...

    def read(self, cursors: dict[str, tuple[int, int]]) -> list[DeviceReading]:
        """Poll every GPU. ``cursors`` maps a GPU UUID to the last device and process
        sample timestamps already seen (µs); only newer samples are returned."""
        ...

    def wait_xid(self, timeout_ms: int) -> list[XidEvent]:
        """Block up to ``timeout_ms`` for Xid events; [] when none came."""
        ...

    def shutdown(self) -> None: ...


class BufferReader(Protocol):
    """A backend that can read the sample buffers alone, between two polls."""

    def read_buffers(self, cursors: dict[str, tuple[int, int]]) -> list[BufferRead]:
        """The samples of each GPU in ``cursors`` newer than its (device, process)
        timestamps; GPUs not in ``cursors`` are not read."""
        ...
