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
import time
from typing import Any

import pynvml

from slurm_gpu_exporter.gpu.backend import GpuUnavailable
from slurm_gpu_exporter.gpu.nvml import sample_buffers
from slurm_gpu_exporter.gpu.nvml.fields import Device, FieldReader, GpuLost, text
from slurm_gpu_exporter.gpu.nvml.gpm import GpmReader
from slurm_gpu_exporter.gpu.nvml.health import HealthReader
from slurm_gpu_exporter.gpu.readings import BufferRead, DeviceReading, HostClocks, XidEvent

log = logging.getLogger(__name__)

# A lost GPU is opened again this often: after a reset it answers again, and is back.
LOST_RECHECK_S = 10.0


def _handle_key(handle: Any) -> int | None:
    return ctypes.cast(handle, ctypes.c_void_p).value


def _register_xid_events(devices: list[Device]) -> Any:
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
        self._devices: list[Device] = []
        self._fields = FieldReader()
        self._health = HealthReader(self._fields)
        self._event_set: Any = None
        self._uuid_by_handle: dict[int | None, str] = {}
        self._gpm = GpmReader()

    # -- life cycle ---------------------------------------------------------

    def init(self) -> str:
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise GpuUnavailable(f"NVML failed to initialise: {exc}") from None
        self._fields = FieldReader()  # a reloaded driver may support what the last did not
        self._health = HealthReader(self._fields)
        try:
            driver = text(pynvml.nvmlSystemGetDriverVersion())
            count = pynvml.nvmlDeviceGetCount()
        except pynvml.NVMLError as exc:
            pynvml.nvmlShutdown()
            raise GpuUnavailable(f"NVML initialised but cannot list GPUs: {exc}") from None
        self._devices = [self._open(i) for i in range(count)]
        self._uuid_by_handle = {_handle_key(d.handle): d.uuid for d in self._devices if d.handle}
        self._event_set = _register_xid_events(self._devices)
        return driver

    def _open(self, index: int, quiet: bool = False) -> Device:
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            uuid = text(pynvml.nvmlDeviceGetUUID(handle))
            name = text(pynvml.nvmlDeviceGetName(handle))
        except pynvml.NVMLError as exc:
            if not quiet:
                log.error("GPU %d cannot be opened (%s); it is reported as lost", index, exc)
            return Device(index, None, "", "", None, "", lost=True, lost_at=time.monotonic())
        minor = self._fields.optional(uuid, "minor", pynvml.nvmlDeviceGetMinorNumber, handle)
        pci = self._fields.optional(uuid, "pci", pynvml.nvmlDeviceGetPciInfo, handle)
        bus_id = text(pci.busId) if pci is not None else ""
        return Device(index, handle, uuid, name, minor, bus_id)

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

    def _read_device(self, d: Device, cursor: tuple[int, int]) -> DeviceReading:
        still_lost = d.lost and not self._answers_again(d)
        base = {"index": d.index, "uuid": d.uuid, "name": d.name, "minor": d.minor,
                "pci_bus_id": d.pci_bus_id}
        if still_lost:
            return DeviceReading(**base, lost=True)
        errors: list[str] = []
        f = self._fields
        try:
            mig = f.mig_instances(d, errors)
            gpm_ok, gpm, mig = self._gpm.read(d.index, d.uuid, d.handle, mig, errors)
            # nvml.h: no utilization samples on a MIG-enabled GPU, instances made or not.
            mig_on = f.mig_on.get(d.uuid, False)
            util = None if mig_on else f.samples(d, "samples", sample_buffers.util_samples,
                                                 cursor[0], errors)
            procs = None if mig_on else f.samples(d, "process_samples",
                                                  sample_buffers.process_samples, cursor[1],
                                                  errors)
            clocks = HostClocks.now()  # right after the sample calls: what they compare with
            memory = f.memory(d.uuid, d.handle, errors)
            power = f.field(d.uuid, "power", pynvml.nvmlDeviceGetPowerUsage, errors, d.handle)
            reading = DeviceReading(
                **base,
                memory_used=memory[0],
                memory_total=memory[1],
                power_watts=power / 1000.0 if power is not None else None,
                energy_mj=f.field(d.uuid, "energy", pynvml.nvmlDeviceGetTotalEnergyConsumption,
                                  errors, d.handle),
                temperature_c=f.field(d.uuid, "temperature", pynvml.nvmlDeviceGetTemperature,
                                      errors, d.handle, pynvml.NVML_TEMPERATURE_GPU),
                ecc_corrected=f.ecc(d, pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, errors),
                ecc_uncorrected=f.ecc(d, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, errors),
                processes=f.processes(d, errors),
                util_samples=util[0] if util else None,
                process_samples=procs[0] if procs else None,
                util_buffer_newest_us=util[1] if util else None,
                process_buffer_newest_us=procs[1] if procs else None,
                util_buffer=util[2] if util else None,
                clocks=clocks,
                mig=mig,
                gpm_supported=gpm_ok,
                gpm=gpm,
                health=self._health.read(d, errors),
                errors=tuple(errors),
                failed=frozenset(e.split(":", 1)[0] for e in errors),  # "field: message"
            )
        except (GpuLost, pynvml.NVMLError_GpuIsLost):
            if not d.lost:
                log.error("GPU %d (%s) is lost (fell off the bus?); its metrics stop, the other "
                          "GPUs keep reporting. It needs a reset or a reboot.", d.index, d.uuid)
            d.lost, d.lost_at = True, time.monotonic()
            return DeviceReading(**base, lost=True)
        return reading

    def _answers_again(self, d: Device) -> bool:
        """Whether a lost GPU, opened again now and then, is the same GPU answering."""
        if time.monotonic() - d.lost_at < LOST_RECHECK_S:
            return False
        d.lost_at = time.monotonic()
        found = self._open(d.index, quiet=True)
        if found.lost or (d.uuid and found.uuid != d.uuid):
            return False
        log.warning("GPU %d (%s) answers again; its metrics resume", d.index, found.uuid)
        d.handle, d.uuid, d.name, d.minor, d.pci_bus_id = (
            found.handle, found.uuid, found.name, found.minor, found.pci_bus_id)
        d.lost = False
        self._health.forget(d.uuid)
        self._uuid_by_handle[_handle_key(d.handle)] = d.uuid
        return True

    def read_buffers(self, cursors: dict[str, tuple[int, int]]) -> list[BufferRead]:
        """The sample buffers alone of the GPUs in ``cursors`` (gpu/driver/buffers.py); a GPU
        that fails here is left to the next poll, which reports it."""
        out = []
        for d in self._devices:
            cursor = cursors.get(d.uuid)
            if d.lost or cursor is None or self._fields.mig_on.get(d.uuid, False):
                continue
            errors: list[str] = []
            try:
                util = self._fields.samples(d, "samples", sample_buffers.util_samples_after,
                                            cursor[0], errors)
                procs = self._fields.samples(d, "process_samples",
                                             sample_buffers.process_samples_after, cursor[1],
                                             errors)
            except (GpuLost, pynvml.NVMLError):
                continue
            out.append(BufferRead(d.uuid, util[0] if util else None, procs,
                                  util[1] if util else None))
        return out

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
