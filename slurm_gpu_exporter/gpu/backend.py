"""The GPU backend protocol: what the GPU sampler needs from a driver.

A backend answers "what does each GPU look like right now": devices, MIG
instances, processes, and the driver's utilization samples newer than a given
timestamp, as the plain data of gpu/readings.py. It keeps no counters; the GPU
sampler integrates. Implementations: ``nvml/backend.py`` (the real driver through
nvidia-ml-py) and ``simulated.py``.
"""

from __future__ import annotations

from typing import Protocol

from slurm_gpu_exporter.gpu.readings import BufferRead, DeviceReading, XidEvent


class GpuUnavailable(Exception):
    """No GPU library or driver (or it failed to initialise); the message says which."""


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
