"""The GPU families beyond busy time and memory: GPM activity and traffic (job and
device), and what slowed a GPU and its errors, per job and per device; a family is
left out where no GPU has it, so nodes without it expose nothing new."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, Metric

from slurm_gpu_exporter.exposition.families import (
    GPU_LABELS,
    JOB_GPU_LABELS,
    _counter,
    _gauge,
    _maybe,
)
from slurm_gpu_exporter.exposition.snapshot import Snapshot

GPM_ACTIVITIES = {
    "sm_active": "SM activity (NVML GPM SM_UTIL: the share of SMs busy)",
    "sm_occupancy": "SM occupancy (NVML GPM SM_OCCUPANCY: resident warps over the maximum)",
    "tensor_active": "tensor-core activity (NVML GPM ANY_TENSOR_UTIL)",
    "dram_active": "DRAM bandwidth use (NVML GPM DRAM_BW_UTIL: share of peak bandwidth)",
    "fp64_active": "non-tensor FP64 activity (NVML GPM FP64_UTIL)",
    "fp32_active": "non-tensor FP32 activity (NVML GPM FP32_UTIL)",
    "fp16_active": "non-tensor FP16 activity (NVML GPM FP16_UTIL)",
}
GPM_TRAFFIC = {
    "pcie_transmit": ("slurm_gpu_pcie_transmit_bytes", "Bytes the GPU sent over PCIe"),
    "pcie_receive": ("slurm_gpu_pcie_receive_bytes", "Bytes the GPU received over PCIe"),
    "nvlink_transmit": ("slurm_gpu_nvlink_transmit_bytes",
                        "Bytes the GPU sent over all its NVLinks"),
    "nvlink_receive": ("slurm_gpu_nvlink_receive_bytes",
                       "Bytes the GPU received over all its NVLinks"),
}


def gpm_families(snapshot: Snapshot) -> Iterator[Metric]:
    """GPM activity counters (job and device) and traffic counters (device); a family
    is left out where no GPU has GPM, so nodes without it expose nothing new."""
    job = {k: _counter(f"slurm_job_gpu_{k}_seconds",
                       f"Seconds of {doc}, integrated over time, while the job had the GPU or "
                       "MIG instance to itself; divide by allocated seconds for the mean.",
                       JOB_GPU_LABELS) for k, doc in GPM_ACTIVITIES.items()}
    device = {k: _counter(f"slurm_gpu_{k}_seconds",
                          f"Seconds of {doc}, integrated over time.", GPU_LABELS)
              for k, doc in GPM_ACTIVITIES.items()}
    traffic = {k: _counter(name, f"{doc}, from NVML GPM.", GPU_LABELS)
               for k, (name, doc) in GPM_TRAFFIC.items()}
    for s in snapshot.job_gpus:
        for k, seconds in s.activity_seconds:
            if k in job:
                job[k].add_metric([s.jobid, s.user, s.gpu, s.uuid], seconds)
    for g in snapshot.gpus:
        for families, totals in ((device, g.activity_seconds), (traffic, g.traffic_bytes)):
            for k, total in totals:
                if k in families:
                    families[k].add_metric([g.gpu, g.uuid], total)
    for family in (*job.values(), *device.values(), *traffic.values()):
        if family.samples:
            yield family


# Health counters by key prefix (snapshot JobGpuSample.health): family, label, help.
HEALTH_COUNTERS = {
    "throttle": ("gpu_throttled_seconds", "reason", "Seconds the GPU's clocks were held down"
                 "{}, by reason (NVML violation counters)"),
    "xid": ("gpu_xid_errors", "xid", "Xid errors{}, by Xid code"),
    "ecc": ("gpu_ecc_errors", "type", "ECC errors (volatile){}"),
    "remapped_rows": ("gpu_remapped_rows", "cause", "Memory rows remapped{}, by cause"),
    "pcie_replays": ("gpu_pcie_replays", "", "PCIe replays{}"),
    "nvlink": ("gpu_nvlink_errors", "kind", "NVLink errors{}, summed over the links, by kind"),
}
_DEVICE_TWINS = ("throttle", "remapped_rows", "pcie_replays", "nvlink")  # the others exist


def health_families(snapshot: Snapshot) -> Iterator[Metric]:
    """Throttled time and errors per job (in full for each job holding the GPU or one of
    its MIG instances) and per device; SM clocks. Left out where no GPU has them."""
    def family(prefix: str, kind: str, whose: str, labels: list[str]) -> CounterMetricFamily:
        name, label, doc = HEALTH_COUNTERS[kind]
        return _counter(f"{prefix}_{name}", doc.format(whose) + ".", labels + [label] * bool(label))

    job = {k: family("slurm_job", k, " while the job held the GPU", JOB_GPU_LABELS)
           for k in HEALTH_COUNTERS}
    device = {k: family("slurm", k, " (the driver's counter)", GPU_LABELS)
              for k in _DEVICE_TWINS}
    xid_last = _gauge("slurm_job_gpu_xid_last_timestamp_seconds", "When the job's last Xid "
                      "of that code was seen (Unix time).", [*JOB_GPU_LABELS, "xid"])
    clock, clock_max = (_gauge(f"slurm_gpu_sm_clock{n}_hertz", d, GPU_LABELS) for n, d in
                        (("", "SM clock now."), ("_max", "Highest SM clock.")))
    for s in snapshot.job_gpus:
        key = [s.jobid, s.user, s.gpu, s.uuid]
        for name, value in s.health:
            kind, _, label = name.partition(":")
            if kind in job:
                job[kind].add_metric(key + ([label] if label else []), value)
        for x, t in s.xid_last_seen:
            xid_last.add_metric([*key, str(x)], t)
    for g in snapshot.gpus:
        for name, value in [*((f"throttle:{r}", v) for r, v in g.throttled_seconds),
                            *g.error_counters]:
            kind, _, label = name.partition(":")
            if kind in device:
                device[kind].add_metric([g.gpu, g.uuid] + ([label] if label else []), value)
        _maybe(clock, [g.gpu, g.uuid], g.sm_clock_hz)
        _maybe(clock_max, [g.gpu, g.uuid], g.sm_clock_max_hz)
    for f in (*job.values(), xid_last, *device.values(), clock, clock_max):
        if f.samples:
            yield f
