"""The NVML backend, through nvidia-ml-py (module ``pynvml``).

Reads devices, MIG instances, processes and the driver's own utilization
sample buffers (``nvmlDeviceGetSamples`` / ``nvmlDeviceGetProcessUtilization``
with a last-seen timestamp), so that every driver sample between two polls is
seen exactly once. A field a GPU does not support is remembered as such and
not asked again; a GPU that reports itself lost is marked and skipped while
the others keep reporting.
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import pynvml

from slurm_gpu_exporter.gpu import nvml_samples
from slurm_gpu_exporter.gpu.backend import (
    DeviceReading,
    GpuProcess,
    GpuUnavailable,
    MigInstance,
    XidEvent,
)
from slurm_gpu_exporter.gpu.clocks import HostClocks
from slurm_gpu_exporter.gpu.gpm import GpmReader

log = logging.getLogger(__name__)

T = TypeVar("T")
_NO_INSTANCE = 0xFFFFFFFF  # gpuInstanceId/computeInstanceId of a process not on MIG


class _Lost(Exception):
    """The GPU fell off the bus (NVML_ERROR_GPU_IS_LOST)."""


@dataclass
class _Device:
    index: int
    handle: Any
    uuid: str
    name: str
    minor: int | None
    pci_bus_id: str
    lost: bool = False


def _text(value: bytes | str) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def _handle_key(handle: Any) -> int | None:
    return ctypes.cast(handle, ctypes.c_void_p).value


def _register_xid_events(devices: list[_Device]) -> Any:
    """An event set with every GPU's Xid events, or None where NVML has none."""
    try:
        event_set = pynvml.nvmlEventSetCreate()
    except pynvml.NVMLError as exc:
        log.warning("Xid events not available: %s", exc)
        return None
    for device in devices:
        if device.handle is None:
            continue
        try:
            pynvml.nvmlDeviceRegisterEvents(device.handle, pynvml.nvmlEventTypeXidCriticalError,
                                            event_set)
        except pynvml.NVMLError as exc:
            log.info("GPU %d: Xid events not available: %s", device.index, exc)
    return event_set


class NvmlBackend:
    """GpuBackend over the real NVML library."""

    def __init__(self) -> None:
        self._devices: list[_Device] = []
        self._unsupported: set[tuple[str, str]] = set()
        self._event_set: Any = None
        self._uuid_by_handle: dict[int | None, str] = {}
        self._gpm = GpmReader()

    # -- life cycle ---------------------------------------------------------

    def init(self) -> str:
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise GpuUnavailable(f"NVML failed to initialise: {exc}") from None
        try:
            driver = _text(pynvml.nvmlSystemGetDriverVersion())
            count = pynvml.nvmlDeviceGetCount()
        except pynvml.NVMLError as exc:
            pynvml.nvmlShutdown()
            raise GpuUnavailable(f"NVML initialised but cannot list GPUs: {exc}") from None
        self._devices = [self._open(i) for i in range(count)]
        self._uuid_by_handle = {_handle_key(d.handle): d.uuid for d in self._devices if d.handle}
        self._event_set = _register_xid_events(self._devices)
        return driver

    def _open(self, index: int) -> _Device:
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            uuid = _text(pynvml.nvmlDeviceGetUUID(handle))
            name = _text(pynvml.nvmlDeviceGetName(handle))
        except pynvml.NVMLError as exc:
            log.error("GPU %d cannot be opened (%s); it is reported as lost", index, exc)
            return _Device(index, None, "", "", None, "", lost=True)
        minor = self._optional(uuid, "minor", pynvml.nvmlDeviceGetMinorNumber, handle)
        pci = self._optional(uuid, "pci", pynvml.nvmlDeviceGetPciInfo, handle)
        bus_id = _text(pci.busId) if pci is not None else ""
        return _Device(index, handle, uuid, name, minor, bus_id)

    def shutdown(self) -> None:
        self._gpm.close()
        try:
            if self._event_set is not None:
                pynvml.nvmlEventSetFree(self._event_set)
            pynvml.nvmlShutdown()
        except pynvml.NVMLError as exc:
            log.debug("NVML shutdown: %s", exc)
        self._event_set = None

    # -- polling ------------------------------------------------------------

    def read(self, cursors: dict[str, tuple[int, int]]) -> list[DeviceReading]:
        return [self._read_device(d, cursors.get(d.uuid, (0, 0))) for d in self._devices]

    def _read_device(self, d: _Device, cursor: tuple[int, int]) -> DeviceReading:
        base = {"index": d.index, "uuid": d.uuid, "name": d.name, "minor": d.minor,
                "pci_bus_id": d.pci_bus_id}
        if d.lost:
            return DeviceReading(**base, lost=True)
        errors: list[str] = []
        try:
            mig = self._mig_instances(d, errors)
            gpm_ok, gpm, mig = self._gpm.read(d.index, d.uuid, d.handle, mig, errors)
            util = None if mig else self._samples(d, "samples", nvml_samples.util_samples,
                                                  cursor[0], errors)
            procs = None if mig else self._samples(d, "process_samples",
                                                   nvml_samples.process_samples, cursor[1],
                                                   errors)
            clocks = HostClocks.now()  # right after the sample calls: what they compare with
            memory = self._memory(d.uuid, d.handle, errors)
            power = self._field(d.uuid, "power", pynvml.nvmlDeviceGetPowerUsage, errors,
                                d.handle)
            reading = DeviceReading(
                **base,
                memory_used=memory[0],
                memory_total=memory[1],
                power_watts=power / 1000.0 if power is not None else None,
                energy_mj=self._field(d.uuid, "energy",
                                      pynvml.nvmlDeviceGetTotalEnergyConsumption, errors,
                                      d.handle),
                temperature_c=self._field(d.uuid, "temperature", pynvml.nvmlDeviceGetTemperature,
                                          errors, d.handle, pynvml.NVML_TEMPERATURE_GPU),
                ecc_corrected=self._ecc(d, pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, errors),
                ecc_uncorrected=self._ecc(d, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, errors),
                processes=self._processes(d, errors),
                util_samples=util[0] if util else None,
                process_samples=procs[0] if procs else None,
                util_buffer_newest_us=util[1] if util else None,
                process_buffer_newest_us=procs[1] if procs else None,
                clocks=clocks,
                mig=mig,
                gpm_supported=gpm_ok,
                gpm=gpm,
                errors=tuple(errors),
                failed=frozenset(e.split(":", 1)[0] for e in errors),  # "field: message"
            )
        except (_Lost, pynvml.NVMLError_GpuIsLost):
            if not d.lost:
                log.error("GPU %d (%s) is lost (fell off the bus?); its metrics stop, the other "
                          "GPUs keep reporting. It needs a reset or a reboot.", d.index, d.uuid)
            d.lost = True
            return DeviceReading(**base, lost=True)
        return reading

    def _call(self, fn: Callable[..., T], *args: Any) -> T:
        try:
            return fn(*args)
        except pynvml.NVMLError_GpuIsLost:
            raise _Lost from None

    def _optional(self, uuid: str, what: str, fn: Callable[..., T], *args: Any) -> T | None:
        try:
            return self._call(fn, *args)
        except (pynvml.NVMLError_NotSupported, pynvml.NVMLError_FunctionNotFound):
            self._unsupported.add((uuid, what))
            return None
        except pynvml.NVMLError:
            return None

    def _field(self, uuid: str, what: str, fn: Callable[..., T], errors: list[str],
               *args: Any) -> T | None:
        """A field, or None where the GPU does not support it (not asked again)."""
        if (uuid, what) in self._unsupported:
            return None
        try:
            return self._call(fn, *args)
        except (pynvml.NVMLError_NotSupported, pynvml.NVMLError_FunctionNotFound):
            self._unsupported.add((uuid, what))
            return None
        except pynvml.NVMLError as exc:
            errors.append(f"{what}: {exc}")
            return None

    def _memory(self, uuid: str, handle: Any, errors: list[str]) -> tuple[int | None, int | None]:
        if (uuid, "memory_v2") not in self._unsupported:
            info = self._field(uuid, "memory_v2", pynvml.nvmlDeviceGetMemoryInfo, errors, handle,
                               pynvml.nvmlMemory_v2)
            if info is not None:
                return int(info.used), int(info.total)
        info = self._field(uuid, "memory", pynvml.nvmlDeviceGetMemoryInfo, errors, handle)
        return (int(info.used), int(info.total)) if info is not None else (None, None)

    def _ecc(self, d: _Device, kind: int, errors: list[str]) -> int | None:
        value = self._field(d.uuid, f"ecc{kind}", pynvml.nvmlDeviceGetTotalEccErrors, errors,
                            d.handle, kind, pynvml.NVML_VOLATILE_ECC)
        return int(value) if value is not None else None

    def _processes(self, d: _Device, errors: list[str]) -> tuple[GpuProcess, ...]:
        by_pid: dict[int, GpuProcess] = {}
        for what, fn in (
            ("compute", pynvml.nvmlDeviceGetComputeRunningProcesses),
            ("graphics", pynvml.nvmlDeviceGetGraphicsRunningProcesses),
            ("mps", pynvml.nvmlDeviceGetMPSComputeRunningProcesses),
        ):
            for proc in self._field(d.uuid, what, fn, errors, d.handle) or ():
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

    def _samples(self, d: _Device, what: str, read: Callable[..., T | None], since_us: int,
                 errors: list[str]) -> T | None:
        """A sample-buffer read (gpu/nvml_samples.py), None where the GPU has none (not
        asked again)."""
        if (d.uuid, what) in self._unsupported:
            return None
        result = read(d.handle, since_us, errors)
        if result is None:
            self._unsupported.add((d.uuid, what))
        return result

    def _mig_instances(self, d: _Device, errors: list[str]) -> tuple[MigInstance, ...]:
        mode = self._field(d.uuid, "mig_mode", pynvml.nvmlDeviceGetMigMode, errors, d.handle)
        if not mode or mode[0] != pynvml.NVML_DEVICE_MIG_ENABLE:
            return ()
        count = self._field(d.uuid, "mig_count", pynvml.nvmlDeviceGetMaxMigDeviceCount, errors,
                            d.handle) or 0
        instances = []
        for i in range(count):
            try:
                mig = self._call(pynvml.nvmlDeviceGetMigDeviceHandleByIndex, d.handle, i)
            except pynvml.NVMLError:
                continue  # an empty slot
            try:
                gi = self._call(pynvml.nvmlDeviceGetGpuInstanceId, mig)
                ci = self._call(pynvml.nvmlDeviceGetComputeInstanceId, mig)
                uuid = _text(self._call(pynvml.nvmlDeviceGetUUID, mig))
                name = _text(self._call(pynvml.nvmlDeviceGetName, mig))
            except pynvml.NVMLError as exc:
                errors.append(f"MIG instance {i}: {exc}")
                continue
            used, total = self._memory(uuid, mig, errors)
            instances.append(MigInstance(int(gi), int(ci), uuid, name, total, used))
        return tuple(instances)

    # -- Xid events (own thread) -------------------------------------------

    def wait_xid(self, timeout_ms: int) -> list[XidEvent]:
        if self._event_set is None:
            raise GpuUnavailable("no NVML event set")
        try:
            data = pynvml.nvmlEventSetWait_v2(self._event_set, timeout_ms)
        except pynvml.NVMLError_Timeout:
            return []
        if data.eventType != pynvml.nvmlEventTypeXidCriticalError:
            return []
        uuid = self._uuid_by_handle.get(_handle_key(data.device), "")
        return [XidEvent(uuid=uuid, xid=int(data.eventData))]
