"""Reading one GPU's driver sample buffers through nvidia-ml-py.

``nvmlDeviceGetSamples`` and ``nvmlDeviceGetProcessUtilization`` return the
samples newer than a ``lastSeenTimeStamp``. The device buffer is read whole (from
0): how many samples it holds and its oldest tell its length (gpu/driver/buffers.py), and
where none is newer than the cursor, its newest timestamp shows a cursor ahead of
it: the driver's clock went back (a clock step, a driver reload), which the
integrator then corrects instead of waiting for the clock to catch up. Process
samples are read from the cursor, and once more from 0 where there are none.
"""

from __future__ import annotations

from typing import Any

import pynvml

from slurm_gpu_exporter.gpu.readings import BufferShape, ProcessUtilSample, UtilSample

Unsupported = (pynvml.NVMLError_NotSupported, pynvml.NVMLError_FunctionNotFound)


def util_samples(handle: Any, since_us: int, errors: list[str]
                 ) -> tuple[tuple[UtilSample, ...], int | None, BufferShape] | None:
    """(device samples newer than ``since_us``, oldest first; where there are none, the
    newest the driver holds; what the whole buffer holds), or None where the GPU has no
    utilization samples. One read of the whole buffer (from 0), which is how its length
    is learned (gpu/driver/buffers.py)."""
    samples = _device_samples_after(handle, 0, errors)
    if samples is None:
        return None
    found, shape, newest = _newer(samples, since_us)
    if found or not since_us:
        return found, None, shape
    return (), newest, shape


def process_samples(handle: Any, since_us: int, errors: list[str]
                    ) -> tuple[tuple[ProcessUtilSample, ...], int | None] | None:
    """As util_samples, for the per-process SM samples."""
    samples = _process_samples_after(handle, since_us, errors)
    if samples is None:
        return None
    found = tuple(ProcessUtilSample(int(s.pid), int(s.timeStamp), float(s.smUtil))
                  for s in samples if s.timeStamp > since_us)
    if found or not since_us:
        return found, None
    everything = _process_samples_after(handle, 0, errors) or ()
    return (), max((int(s.timeStamp) for s in everything), default=None)


def util_samples_after(handle: Any, since_us: int, errors: list[str]
                       ) -> tuple[tuple[UtilSample, ...], BufferShape] | None:
    """The device samples newer than ``since_us``, oldest first, and what the whole
    buffer holds, without the re-read (a read between two polls); None where the GPU
    has none."""
    samples = _device_samples_after(handle, 0, errors)
    if samples is None:
        return None
    found, shape, _ = _newer(samples, since_us)
    return found, shape


def _newer(samples: list[Any], since_us: int
           ) -> tuple[tuple[UtilSample, ...], BufferShape, int | None]:
    """(the samples newer than ``since_us``, oldest first; what the whole buffer holds;
    its newest timestamp). Only the new samples are sorted and converted: a full buffer
    holds about a hundred, a read between two samples finds a few new ones."""
    stamps = [s.timeStamp for s in samples]
    if not stamps:
        return (), BufferShape(0, None), None
    new = sorted((t, i) for i, t in enumerate(stamps) if t > since_us)
    found = tuple(UtilSample(int(t), float(samples[i].sampleValue.uiVal)) for t, i in new)
    return found, BufferShape(len(stamps), int(min(stamps))), int(max(stamps))


def process_samples_after(handle: Any, since_us: int, errors: list[str]
                          ) -> tuple[ProcessUtilSample, ...] | None:
    """As util_samples_after, for the per-process SM samples."""
    samples = _process_samples_after(handle, since_us, errors)
    if samples is None:
        return None
    return tuple(ProcessUtilSample(int(s.pid), int(s.timeStamp), float(s.smUtil))
                 for s in samples if s.timeStamp > since_us)


def _device_samples_after(handle: Any, since_us: int, errors: list[str]) -> list[Any] | None:
    """The raw samples; [] for none (or a failed read, noted in ``errors``); None where
    the GPU has none at all. A lost GPU's error goes up to the caller."""
    try:
        _, samples = pynvml.nvmlDeviceGetSamples(handle, pynvml.NVML_GPU_UTILIZATION_SAMPLES,
                                                 since_us)
    except pynvml.NVMLError_NotFound:
        return []  # no sample newer than the cursor
    except Unsupported:
        return None
    except pynvml.NVMLError_GpuIsLost:
        raise
    except pynvml.NVMLError as exc:
        errors.append(f"utilization samples: {exc}")
        return []
    return list(samples)


def _process_samples_after(handle: Any, since_us: int, errors: list[str]) -> list[Any] | None:
    try:
        return list(pynvml.nvmlDeviceGetProcessUtilization(handle, since_us))
    except pynvml.NVMLError_NotFound:
        return []
    except Unsupported:
        return None
    except pynvml.NVMLError_GpuIsLost:
        raise
    except pynvml.NVMLError as exc:
        errors.append(f"process utilization samples: {exc}")
        return []
