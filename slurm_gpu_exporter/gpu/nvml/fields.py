"""Reading one NVML field at a time: a field a GPU does not support is remembered as such
and not asked again; a GPU that reports itself lost raises ``GpuLost``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import pynvml

from slurm_gpu_exporter.gpu.readings import GpuProcess, MigInstance

T = TypeVar("T")
_NO_INSTANCE = 0xFFFFFFFF  # gpuInstanceId/computeInstanceId of a process not on MIG


class GpuLost(Exception):
    """The GPU fell off the bus (NVML_ERROR_GPU_IS_LOST)."""


@dataclass
class Device:
    """One GPU as NVML opened it at init."""

    index: int
    handle: Any
    uuid: str
    name: str
    minor: int | None
    pci_bus_id: str
    lost: bool = False
    lost_at: float = 0.0  # host monotonic time it was last found lost


def text(value: bytes | str) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else value


class FieldReader:
    """NVML calls for the fields of one poll, with the set of (GPU, field) not supported."""

    def __init__(self) -> None:
        self.unsupported: set[tuple[str, str]] = set()
        self.mig_on: dict[str, bool] = {}  # uuid -> MIG mode enabled at the last poll

    def call(self, fn: Callable[..., T], *args: Any) -> T:
        try:
            return fn(*args)
        except pynvml.NVMLError_GpuIsLost:
            raise GpuLost from None

    def optional(self, uuid: str, what: str, fn: Callable[..., T], *args: Any) -> T | None:
        try:
            return self.call(fn, *args)
        except (pynvml.NVMLError_NotSupported, pynvml.NVMLError_FunctionNotFound):
            self.unsupported.add((uuid, what))
            return None
        except pynvml.NVMLError:
            return None

    def field(self, uuid: str, what: str, fn: Callable[..., T], errors: list[str],
               *args: Any) -> T | None:
        """A field, or None where the GPU does not support it (not asked again)."""
        if (uuid, what) in self.unsupported:
            return None
        try:
            return self.call(fn, *args)
        except (pynvml.NVMLError_NotSupported, pynvml.NVMLError_FunctionNotFound):
            self.unsupported.add((uuid, what))
            return None
        except pynvml.NVMLError as exc:
            errors.append(f"{what}: {exc}")
            return None

    def memory(self, uuid: str, handle: Any, errors: list[str]) -> tuple[int | None, int | None]:
        if (uuid, "memory_v2") not in self.unsupported:
            info = self.field(uuid, "memory_v2", pynvml.nvmlDeviceGetMemoryInfo, errors, handle,
                               pynvml.nvmlMemory_v2)
            if info is not None:
                return int(info.used), int(info.total)
        info = self.field(uuid, "memory", pynvml.nvmlDeviceGetMemoryInfo, errors, handle)
        return (int(info.used), int(info.total)) if info is not None else (None, None)

    def ecc(self, d: Device, kind: int, errors: list[str]) -> int | None:
        value = self.field(d.uuid, f"ecc{kind}", pynvml.nvmlDeviceGetTotalEccErrors, errors,
                            d.handle, kind, pynvml.NVML_VOLATILE_ECC)
        return int(value) if value is not None else None

    def processes(self, d: Device, errors: list[str]) -> tuple[GpuProcess, ...]:
        by_pid: dict[int, GpuProcess] = {}
        for what, fn in (
            ("compute", pynvml.nvmlDeviceGetComputeRunningProcesses),
            ("graphics", pynvml.nvmlDeviceGetGraphicsRunningProcesses),
            ("mps", pynvml.nvmlDeviceGetMPSComputeRunningProcesses),
        ):
            for proc in self.field(d.uuid, what, fn, errors, d.handle) or ():
                gi = getattr(proc, "gpuInstanceId", _NO_INSTANCE)
                ci = getattr(proc, "computeInstanceId", _NO_INSTANCE)
                memory = proc.usedGpuMemory
                previous = by_pid.get(proc.pid)
                if previous is not None and (previous.used_memory or 0) >= (memory or 0):
                    continue
                by_pid[proc.pid] = GpuProcess(
                    pid=int(proc.pid),
                    used_memory=int(memory) if memory is not None else None,
                    gpu_instance_id=None if gi in (None, _NO_INSTANCE) else int(gi),
                    compute_instance_id=None if ci in (None, _NO_INSTANCE) else int(ci),
                )
        return tuple(by_pid.values())

    def samples(self, d: Device, what: str, read: Callable[..., T | None], since_us: int,
                 errors: list[str]) -> T | None:
        """A sample-buffer read (gpu/nvml/sample_buffers.py), None where the GPU has none (not
        asked again)."""
        if (d.uuid, what) in self.unsupported:
            return None
        result = read(d.handle, since_us, errors)
        if result is None:
            self.unsupported.add((d.uuid, what))
        return result

    def mig_instances(self, d: Device, errors: list[str]) -> tuple[MigInstance, ...]:
        """The GPU's MIG instances (none where MIG is off or none is made yet). A change of
        MIG mode forgets what the GPU did not support: the sample calls a MIG-enabled GPU
        refuses work again once MIG is off."""
        mode = self.field(d.uuid, "mig_mode", pynvml.nvmlDeviceGetMigMode, errors, d.handle)
        enabled = bool(mode) and mode[0] == pynvml.NVML_DEVICE_MIG_ENABLE
        if self.mig_on.get(d.uuid, enabled) != enabled:
            self.unsupported = {u for u in self.unsupported
                                if u[0] != d.uuid or u[1] == "mig_mode"}
        self.mig_on[d.uuid] = enabled
        if not enabled:
            return ()
        count = self.field(d.uuid, "mig_count", pynvml.nvmlDeviceGetMaxMigDeviceCount, errors,
                            d.handle) or 0
        instances = []
        for i in range(count):
            try:
                mig = self.call(pynvml.nvmlDeviceGetMigDeviceHandleByIndex, d.handle, i)
            except pynvml.NVMLError:
                continue  # an empty slot
            try:
                gi = self.call(pynvml.nvmlDeviceGetGpuInstanceId, mig)
                ci = self.call(pynvml.nvmlDeviceGetComputeInstanceId, mig)
                uuid = text(self.call(pynvml.nvmlDeviceGetUUID, mig))
                name = text(self.call(pynvml.nvmlDeviceGetName, mig))
            except pynvml.NVMLError as exc:
                errors.append(f"MIG instance {i}: {exc}")
                continue
            used, total = self.memory(uuid, mig, errors)
            instances.append(MigInstance(int(gi), int(ci), uuid, name, total, used))
        return tuple(instances)
