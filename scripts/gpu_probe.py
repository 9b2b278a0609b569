"""``scripts/gpu-check --probe``: record the raw facts of a driver into a JSON file.

What the agent's arithmetic assumes about NVML's sample buffers, taken from the
driver itself, so that a first run on new hardware teaches us the driver even where
the accuracy check fails. Per GPU, over ``seconds`` of polling:

- device samples (``nvmlDeviceGetSamples``) and process samples
  (``nvmlDeviceGetProcessUtilization``): the host clock each call stamps on (the
  offset of its newest sample from CLOCK_REALTIME, CLOCK_BOOTTIME, CLOCK_MONOTONIC
  read right after the call), sample spacing, the span the buffer holds, samples
  per process per read and how old they are, values above 100 %;
- samples taken while the GPU is idle: ``before_load`` is polled before the check
  starts its load, ``with_load`` while it runs (where CUDA is there to run it);
- the energy counter's step size and how often it moves;
- NVML GPM (Hopper and later): the return code of the support query, of taking a
  sample, and of each metric;
- throttling and error counters (violation counters' units and clocks, clocks-event
  reasons, SM clocks, remapped rows, PCIe replays, NVLink; gpu_probe_health.py says
  what real drivers may do differently from the fake);
- the whole device-sample buffer in one read after ``--probe-busy`` seconds (40) of
  100 % load: how many samples it holds, their span and period, and whether a re-read
  stamps them the same (``full_buffer``).

Only nvidia-ml-py is needed; nothing here reads the agent.
"""

from __future__ import annotations

import itertools
import json
import statistics
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import gpu_probe_health

CLOCKS = {"realtime": time.CLOCK_REALTIME, "boottime": time.CLOCK_BOOTTIME,
          "monotonic": time.CLOCK_MONOTONIC}
# NVML_GPM_METRIC_* ids asked for, by our name (nvml.h numbers).
GPM_METRIC_IDS = {
    "graphics_util": 1, "sm_util": 2, "sm_occupancy": 3, "integer_util": 4,
    "any_tensor_util": 5, "dfma_tensor_util": 6, "hmma_tensor_util": 7,
    "imma_tensor_util": 9, "dram_bw_util": 10, "fp64_util": 11, "fp32_util": 12,
    "fp16_util": 13, "pcie_tx_per_sec": 20, "pcie_rx_per_sec": 21,
    "nvlink_total_rx_per_sec": 60, "nvlink_total_tx_per_sec": 61,
}  # fmt: skip
PROBE_VERSION = 3  # 2: full_buffer; 3: health (gpu_probe_health.py)


def host_clocks() -> dict[str, float]:
    return {name: time.clock_gettime(clock) for name, clock in CLOCKS.items()}


def clock_facts(newest_us: int, clocks: dict[str, float]) -> dict[str, Any]:
    """The newest sample against each host clock: seconds behind it, and the clock it is
    least behind (within a minute), or None."""
    behind = {name: round(value - newest_us / 1e6, 6) for name, value in clocks.items()}
    fits = [(abs(b), n) for n, b in behind.items() if -2.0 <= b <= 60.0]
    return {"clock": min(fits)[1] if fits else None, "seconds_behind": behind}


def spread(values: Iterable[float]) -> dict[str, float] | None:
    """min / median / max of some numbers, None where there are none."""
    got = sorted(values)
    if not got:
        return None
    return {"min": got[0], "median": statistics.median(got), "max": got[-1], "n": len(got)}


def error_name(exc: Exception) -> str:
    """An NVML error as its NVML_ERROR_* name where pynvml knows it."""
    import pynvml

    value = getattr(exc, "value", None)
    for name in dir(pynvml):
        if name.startswith("NVML_ERROR_") and getattr(pynvml, name) == value:
            return name
    return f"{type(exc).__name__}: {exc}"


class CallLog:
    """What one sample-buffer call returned over a probe, poll after poll."""

    def __init__(self) -> None:
        self.reads = 0
        self.errors: dict[str, int] = {}
        self.stamps: set[int] = set()
        self.per_read: list[int] = []
        self.clock_facts: list[dict[str, Any]] = []
        self.above_100 = 0
        self.first_buffer: list[int] | None = None  # the whole buffer at the first read
        self.per_pid_per_read: list[int] = []
        self.ages_s: list[float] = []

    def error(self, exc: Exception) -> None:
        self.reads += 1
        name = error_name(exc)
        self.errors[name] = self.errors.get(name, 0) + 1

    def got(self, stamps: list[int], values: list[float], pids: list[int] | None,
            clocks: dict[str, float]) -> None:
        self.reads += 1
        new = [s for s in stamps if s not in self.stamps]
        self.per_read.append(len(new))
        self.stamps.update(stamps)
        if self.first_buffer is None:
            self.first_buffer = sorted(stamps)
        self.above_100 += sum(1 for v in values if v > 100)
        if stamps:
            facts = clock_facts(max(stamps), clocks)
            self.clock_facts.append(facts)
            if facts["clock"] is not None:
                now = clocks[facts["clock"]]
                self.ages_s += [round(now - s / 1e6, 3) for s in stamps]
        if pids is not None:
            counts: dict[int, int] = {}
            for pid in pids:
                counts[pid] = counts.get(pid, 0) + 1
            self.per_pid_per_read += list(counts.values())

    def summary(self) -> dict[str, Any]:
        ordered = sorted(self.stamps)
        spacing = [(b - a) / 1e6 for a, b in itertools.pairwise(ordered)]
        buffer = self.first_buffer or []
        clocks = [f["clock"] for f in self.clock_facts]
        return {
            "reads": self.reads,
            "errors": self.errors,
            "samples": len(ordered),
            "clock": max(set(clocks), key=clocks.count) if clocks else None,
            "clocks_seen": sorted({str(c) for c in clocks}),
            "last_clock_facts": self.clock_facts[-1] if self.clock_facts else None,
            "spacing_s": spread(spacing),
            "buffer_span_s": (buffer[-1] - buffer[0]) / 1e6 if len(buffer) > 1 else 0.0,
            "buffer_samples": len(buffer),
            "new_samples_per_read": spread(self.per_read),
            "samples_per_process_per_read": spread(self.per_pid_per_read),
            "age_s": spread(self.ages_s),
            "values_above_100": self.above_100,
        }


def probe_sample_buffers(handle: Any, seconds: float, interval: float) -> dict[str, Any]:
    """Poll both sample-buffer calls of one GPU for ``seconds``, from lastSeenTimeStamp 0
    and then from the newest sample seen, as the agent does."""
    import pynvml

    device, process = CallLog(), CallLog()
    dev_cursor = proc_cursor = 0
    deadline = time.monotonic() + seconds
    while True:
        try:
            _, samples = pynvml.nvmlDeviceGetSamples(
                handle, pynvml.NVML_GPU_UTILIZATION_SAMPLES, dev_cursor)
            clocks = host_clocks()
            stamps = [int(s.timeStamp) for s in samples]
            device.got(stamps, [float(s.sampleValue.uiVal) for s in samples], None, clocks)
            dev_cursor = max([dev_cursor, *stamps])
        except pynvml.NVMLError as exc:
            device.error(exc)
        try:
            psamples = pynvml.nvmlDeviceGetProcessUtilization(handle, proc_cursor)
            clocks = host_clocks()
            stamps = [int(s.timeStamp) for s in psamples]
            process.got(stamps, [float(s.smUtil) for s in psamples],
                        [int(s.pid) for s in psamples], clocks)
            # The oldest of the newest per process: no process's next sample is skipped.
            newest: dict[int, int] = {}
            for s in psamples:
                newest[int(s.pid)] = max(newest.get(int(s.pid), 0), int(s.timeStamp))
            proc_cursor = min(newest.values(), default=proc_cursor)
        except pynvml.NVMLError as exc:
            process.error(exc)
        if time.monotonic() >= deadline:
            break
        time.sleep(interval)
    return {"device_samples": device.summary(), "process_samples": process.summary()}


def probe_full_buffer(handle: Any, under_load: bool) -> dict[str, Any]:
    """The whole device-sample buffer in one read from 0: its length, the span it holds
    and the period of its samples. Taken after the GPU has been busy long enough to
    fill it (``under_load``), this is what the agent's buffer reads are spaced by
    (slurm_gpu_exporter/gpu/driver/buffers.py); on an idle GPU, whether a read says
    NOT_FOUND. The same read again, to see that the stamps do not move."""
    import pynvml

    try:
        _, samples = pynvml.nvmlDeviceGetSamples(handle, pynvml.NVML_GPU_UTILIZATION_SAMPLES, 0)
        _, again = pynvml.nvmlDeviceGetSamples(handle, pynvml.NVML_GPU_UTILIZATION_SAMPLES, 0)
    except pynvml.NVMLError as exc:
        return {"under_load": under_load, "read": error_name(exc), "samples": 0}
    stamps = sorted(int(s.timeStamp) for s in samples)
    spacing = [(b - a) / 1e6 for a, b in itertools.pairwise(stamps)]
    return {
        "under_load": under_load, "read": "NVML_SUCCESS", "samples": len(stamps),
        "span_s": (stamps[-1] - stamps[0]) / 1e6 if len(stamps) > 1 else 0.0,
        "period_s": statistics.median(spacing) if spacing else None,
        "busy_samples": sum(1 for s in samples if s.sampleValue.uiVal > 0),
        # samples of the first read, still in the buffer, that a re-read stamps otherwise
        # (0: stamped once and stored, as the agent assumes)
        "restamped_on_reread": _restamped(stamps, [int(s.timeStamp) for s in again]),
    }


def _restamped(first: list[int], second: list[int]) -> int:
    if not first or not second:
        return 0
    oldest, newest, kept = min(second), max(first), set(second)
    return sum(1 for ts in first if oldest <= ts <= newest and ts not in kept)


def probe_energy(handle: Any, seconds: float) -> dict[str, Any]:
    """The energy counter read every 10 ms: how big its steps are and how often it moves."""
    import pynvml

    readings: list[tuple[float, int]] = []
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline:
            readings.append((time.monotonic(), int(pynvml.nvmlDeviceGetTotalEnergyConsumption(
                handle))))
            time.sleep(0.01)
    except pynvml.NVMLError as exc:
        return {"error": error_name(exc)}
    pairs = list(itertools.pairwise(readings))
    changes = [(t, e) for (_, before), (t, e) in pairs if e != before]
    steps = [b - a for (_, a), (_, b) in pairs if b != a]
    apart = [b - a for (a, _), (b, _) in itertools.pairwise(changes)]
    return {"reads": len(readings), "changes": len(changes), "step_mj": spread(steps),
            "seconds_between_changes": spread(apart)}


def probe_gpm(handle: Any) -> dict[str, Any]:
    """GPM support, a sample pair one second apart, and each metric's return code."""
    import pynvml

    out: dict[str, Any] = {}
    try:
        out["supported"] = bool(pynvml.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice)
    except pynvml.NVMLError as exc:
        return {"supported": None, "query": error_name(exc)}
    if not out["supported"]:
        return out
    samples: list[Any] = []
    try:
        for _ in range(2):
            sample = pynvml.nvmlGpmSampleAlloc()
            samples.append(sample)
            pynvml.nvmlGpmSampleGet(handle, sample)
            time.sleep(1.0 if len(samples) == 1 else 0)
        request = pynvml.c_nvmlGpmMetricsGet_t()
        request.version = pynvml.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(GPM_METRIC_IDS)
        request.sample1, request.sample2 = samples
        for i, metric in enumerate(GPM_METRIC_IDS.values()):
            request.metrics[i].metricId = metric
        pynvml.nvmlGpmMetricsGet(request)
        out["call"] = "NVML_SUCCESS"
        out["metrics"] = {
            name: {"return": _return_name(request.metrics[i].nvmlReturn),
                   "value": round(float(request.metrics[i].value), 4)}
            for i, name in enumerate(GPM_METRIC_IDS)}
    except pynvml.NVMLError as exc:
        out["call"] = error_name(exc)
    finally:
        for sample in samples:
            try:
                pynvml.nvmlGpmSampleFree(sample)
            except pynvml.NVMLError:
                pass
    return out


def _full_buffer(handle: Any, uuid: str, start: Callable[[str], tuple[Any, str]] | None,
                 busy_s: float) -> dict[str, Any]:
    load = None
    if start is not None:
        try:
            load, _ = start(uuid)
        except RuntimeError:
            load = None
    if load is None:
        return probe_full_buffer(handle, under_load=False)
    try:
        time.sleep(busy_s)
        return probe_full_buffer(handle, under_load=True)
    finally:
        load.terminate()


def _return_name(value: int) -> str:
    import pynvml

    if value == pynvml.NVML_SUCCESS:
        return "NVML_SUCCESS"
    for name in dir(pynvml):
        if name.startswith("NVML_ERROR_") and getattr(pynvml, name) == value:
            return name
    return str(value)


def _text(value: bytes | str) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def run_probe(out: Path, gpus: list[int] | None, seconds: float, interval: float,
              start_load: Callable[[str], tuple[Any, str]] | None = None,
              start_full_load: Callable[[str], tuple[Any, str]] | None = None,
              busy_s: float = 40.0) -> dict[str, Any]:
    """Probe the GPUs (all, or the NVML indices in ``gpus``), write the JSON to ``out``
    and return it. ``start_load(uuid)`` starts a load on a GPU for the busy phase and
    returns (something to stop it with ``.terminate()``, a description), or raises
    RuntimeError where no load can run (then only the idle phase is recorded).
    ``start_full_load`` likewise starts a 100 % load, run ``busy_s`` before the whole
    buffer is read (without it, or where it cannot run, the buffer is read as it is)."""
    import pynvml

    pynvml.nvmlInit()
    try:
        report: dict[str, Any] = {
            "probe_version": PROBE_VERSION, "when": time.time(),
            "driver": _text(pynvml.nvmlSystemGetDriverVersion()),
            "nvml_version": _text(pynvml.nvmlSystemGetNVMLVersion()),
            "seconds": seconds, "poll_interval_s": interval, "gpus": []}
        indices = gpus if gpus is not None else list(range(pynvml.nvmlDeviceGetCount()))
        for index in indices:
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            uuid = _text(pynvml.nvmlDeviceGetUUID(handle))
            gpu: dict[str, Any] = {"index": index, "uuid": uuid,
                                   "name": _text(pynvml.nvmlDeviceGetName(handle))}
            try:
                gpu["architecture"] = int(pynvml.nvmlDeviceGetArchitecture(handle))
            except pynvml.NVMLError as exc:
                gpu["architecture"] = error_name(exc)
            gpu["before_load"] = probe_sample_buffers(handle, seconds, interval)
            gpu["energy_before_load"] = probe_energy(handle, min(seconds, 2.0))
            load = None
            if start_load is not None:
                try:
                    load, gpu["load"] = start_load(uuid)
                except RuntimeError as exc:
                    gpu["load"] = f"not run: {exc}"
            if load is not None:
                try:
                    gpu["with_load"] = probe_sample_buffers(handle, seconds, interval)
                    gpu["energy_with_load"] = probe_energy(handle, min(seconds, 2.0))
                    gpu["gpm"] = probe_gpm(handle)
                finally:
                    load.terminate()
            else:
                gpu["gpm"] = probe_gpm(handle)
            gpu["full_buffer"] = _full_buffer(handle, uuid, start_full_load, busy_s)
            gpu["health"] = gpu_probe_health.probe_health(handle, min(seconds, 2.0))
            report["gpus"].append(gpu)
    finally:
        pynvml.nvmlShutdown()
    out.write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    return report
