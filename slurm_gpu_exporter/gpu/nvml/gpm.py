"""NVML GPM (GPU performance monitoring, Hopper and later): what the GPU's units did.

Where "busy" says only that some kernel ran, GPM says how many SMs were active,
how full they were, and how busy the tensor cores and DRAM were. NVML computes
these as means between two samples its caller takes: for every GPU that has GPM
(and every MIG GPU instance on it, through ``nvmlGpmMigSampleGet``) one sample is
taken per poll, and the means since the previous good sample are handed on with
the interval's length on the agent's clock. A sample or computation that fails
keeps the previous sample, so the next good poll covers the gap and nothing is
lost. A GPU without GPM is logged once and never asked again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import pynvml

from slurm_gpu_exporter.gpu.readings import GpmFigures, MigInstance

log = logging.getLogger(__name__)

MIB = 1 << 20

# Our names for the NVML_GPM_METRIC_* ids (stable numbers in nvml.h): fractions of
# time (or of SMs, warps, bandwidth) reported in percent ...
ACTIVITY_METRICS = {
    "sm_active": 2,  # SM_UTIL: share of SMs busy
    "sm_occupancy": 3,  # SM_OCCUPANCY: active warps vs the theoretical maximum
    "tensor_active": 5,  # ANY_TENSOR_UTIL
    "dram_active": 10,  # DRAM_BW_UTIL: DRAM bandwidth used vs the peak
    "fp64_active": 11,
    "fp32_active": 12,
    "fp16_active": 13,
}
# ... and traffic in MiB/s, whole GPUs only.
TRAFFIC_METRICS = {
    "pcie_transmit": 20,
    "pcie_receive": 21,
    "nvlink_receive": 60,
    "nvlink_transmit": 61,
}
_NAMES = {i: n for n, i in (*ACTIVITY_METRICS.items(), *TRAFFIC_METRICS.items())}
_UNSUPPORTED = (pynvml.NVMLError_NotSupported, pynvml.NVMLError_FunctionNotFound)


# NVML wants two GPM samples at least this far apart for metrics that mean anything
# (nvml.h, nvmlGpmMetricsGet); polls closer than that (a retried read, two compute
# instances of one GPU instance read back to back) keep the previous sample.
MIN_SPACING_S = 0.1

class _Stream:
    """Two sample buffers of one GPU or MIG GPU instance and the request NVML fills."""

    def __init__(self, metric_ids: list[int]) -> None:
        self.previous: Any = None  # the last good sample, the start of the next interval
        self.previous_at = 0.0
        self.spare: Any = None
        self.request = pynvml.c_nvmlGpmMetricsGet_t()
        self.request.version = pynvml.NVML_GPM_METRICS_GET_VERSION
        self.request.numMetrics = len(metric_ids)
        for i, metric in enumerate(metric_ids):
            self.request.metrics[i].metricId = metric
        self.unsupported = False

    def free(self) -> None:
        for sample in (self.previous, self.spare):
            if sample is not None:
                try:
                    pynvml.nvmlGpmSampleFree(sample)
                except pynvml.NVMLError as exc:
                    log.debug("freeing a GPM sample: %s", exc)
        self.previous = self.spare = None


@dataclass
class _Gpu:
    supported: bool | None = None  # None: not known yet (the query failed)


class GpmReader:
    """GPM figures per GPU and MIG GPU instance, one sample each per ``read``."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._gpus: dict[str, _Gpu] = {}
        self._streams: dict[tuple[str, int | None], _Stream] = {}

    def read(self, index: int, uuid: str, handle: Any, mig: tuple[MigInstance, ...],
             errors: list[str]) -> tuple[bool, GpmFigures | None, tuple[MigInstance, ...]]:
        """(supported, the GPU's figures, the MIG instances with theirs). A MIG-enabled
        GPU is measured per instance only. Raises NVMLError_GpuIsLost."""
        if not self._supported(index, uuid, handle, errors):
            return False, None, mig
        live = {None} if not mig else {m.gpu_instance_id for m in mig}
        for key in [k for k in self._streams if k[0] == uuid and k[1] not in live]:
            self._streams.pop(key).free()  # MIG turned on or off, an instance went away
        if not mig:
            return True, self._figures(uuid, None, handle, errors), mig
        # One GPM sample per GPU instance, however many compute instances it has.
        by_gi: dict[int, GpmFigures | None] = {}
        for m in mig:
            if m.gpu_instance_id not in by_gi:
                by_gi[m.gpu_instance_id] = self._figures(uuid, m.gpu_instance_id, handle, errors)
        return True, None, tuple(replace(m, gpm=by_gi[m.gpu_instance_id]) for m in mig)

    def close(self) -> None:
        """Free every sample buffer (before NVML shuts down)."""
        for stream in self._streams.values():
            stream.free()
        self._streams.clear()
        self._gpus.clear()

    def _supported(self, index: int, uuid: str, handle: Any, errors: list[str]) -> bool:
        gpu = self._gpus.setdefault(uuid, _Gpu())
        if gpu.supported is None:
            try:
                gpu.supported = bool(pynvml.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice)
            except _UNSUPPORTED:
                gpu.supported = False
            except pynvml.NVMLError_GpuIsLost:
                raise
            except pynvml.NVMLError as exc:
                errors.append(f"gpm: support query failed: {exc}")
                return False
            if not gpu.supported:
                log.info("GPU %d (%s) has no NVML GPM (it needs a Hopper or newer GPU and "
                         "driver): SM, tensor and DRAM activity are not reported for it",
                         index, uuid)
        return gpu.supported

    def _figures(self, uuid: str, gi: int | None, handle: Any, errors: list[str]
                 ) -> GpmFigures | None:
        key = (uuid, gi)
        stream = self._streams.get(key)
        if stream is None:
            ids = list(ACTIVITY_METRICS.values())
            if gi is None:
                ids += TRAFFIC_METRICS.values()
            stream = self._streams[key] = _Stream(ids)
        if stream.unsupported:
            return None
        if stream.previous is not None and self._clock() - stream.previous_at < MIN_SPACING_S:
            return None  # too soon for a good interval: the next read covers this one too
        try:
            if stream.spare is None:
                stream.spare = pynvml.nvmlGpmSampleAlloc()
            if gi is None:
                pynvml.nvmlGpmSampleGet(handle, stream.spare)
            else:
                pynvml.nvmlGpmMigSampleGet(handle, gi, stream.spare)
            now = self._clock()
            if stream.previous is None:
                stream.previous, stream.previous_at, stream.spare = stream.spare, now, None
                return None
            stream.request.sample1, stream.request.sample2 = stream.previous, stream.spare
            pynvml.nvmlGpmMetricsGet(stream.request)
        except pynvml.NVMLError_GpuIsLost:
            raise
        except _UNSUPPORTED:
            where = "" if gi is None else f" (MIG GPU instance {gi})"
            log.info("GPU %s%s: GPM sampling is not supported; its activity is not reported",
                     uuid, where)
            stream.unsupported = True
            stream.free()
            return None
        except pynvml.NVMLError as exc:
            # The previous sample stays: the next good read covers this interval too.
            errors.append(f"gpm: {exc}")
            return None
        figures = _figures_of(stream.request, now - stream.previous_at)
        stream.previous, stream.spare = stream.spare, stream.previous
        stream.previous_at = now
        return figures


def _figures_of(request: Any, seconds: float) -> GpmFigures:
    """The metrics NVML filled in, as fractions and bytes/s; failed metrics left out."""
    activity: dict[str, float] = {}
    traffic: dict[str, float] = {}
    for i in range(request.numMetrics):
        metric = request.metrics[i]
        if metric.nvmlReturn != pynvml.NVML_SUCCESS:
            continue
        name = _NAMES[metric.metricId]
        value = float(metric.value)
        if name in ACTIVITY_METRICS:
            activity[name] = min(max(value / 100.0, 0.0), 1.0)
        else:
            traffic[name] = max(value, 0.0) * MIB
    return GpmFigures(seconds=seconds, activity=activity, traffic=traffic)
