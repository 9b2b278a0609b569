"""Rows of a report as plain values, shared by every text format."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from slurm_gpu_exporter.report.figures.gpu_events import SLOWING, share
from slurm_gpu_exporter.report.figures.job_events import fault_lines, throttle_lines
from slurm_gpu_exporter.report.figures.shapes import (
    GpuDetail,
    JobDetail,
    JobUsage,
    LowUtilReport,
    Total,
)
from slurm_gpu_exporter.report.figures.table import (
    FIGURES,
    gpm_activities,
    json_value,
    shown,
    value_of,
)

GIB = 2**30

LOW_UTIL_COLUMNS = ("job", "user", "account", "partition", "gpus", "gpu_hours", "busy_ratio",
                    "idle_gpus", "gpu_memory_peak_gib", "wasted_gpu_hours")
# Columns printed right-aligned, as numbers: the tables' and usage's (with the GPU-hours
# of each figure the table gives a usage heading).
NUMERIC = frozenset({
    "gpus", "gpu_hours", "busy_ratio", "sm_active_ratio", "idle_gpus", "gpu_memory_peak_gib",
    "wasted_gpu_hours", "jobs", "allocated_hours", "gpu_memory_total_gib", "energy_kwh",
    "busy_gpu_hours", "sm_active_gpu_hours", "cpu_hours", "cpu_energy_kwh", "emissions_kg",
    *(f"{f.name}_gpu_hours" for f in FIGURES if f.usage_heading)})

HEADINGS = {
    "job": "Job", "user": "User", "account": "Account", "partition": "Partition",
    "gpus": "GPUs", "gpu_hours": "GPU-h", "busy_ratio": "Busy", "idle_gpus": "Idle GPUs",
    "gpu_memory_peak_gib": "Peak GPU mem", "wasted_gpu_hours": "Wasted GPU-h",
    "jobs": "Jobs", "key": "",
}


def job_row(job: JobUsage) -> dict[str, Any]:
    """One low-util row as numbers (None where unknown)."""
    return {
        "job": job.shown, "user": job.user, "account": job.account,
        "partition": job.partition, "gpus": job.gpus, "gpu_hours": job.gpu_hours,
        "busy_ratio": job.busy_ratio, "idle_gpus": job.idle_gpus,
        "gpu_memory_peak_gib": job.gpu_memory_peak / GIB if job.gpu_memory_peak is not None
        else None,
        "wasted_gpu_hours": job.wasted_gpu_hours,
    }


def low_util_notes(report: LowUtilReport) -> list[str]:
    """``Job 81301: slowed by its GPU rather than idle: …``, in the table's order."""
    return [f"Job {job.shown}: {report.notes[job.jobid]}" for job in report.flagged
            if job.jobid in report.notes]


def total_row(total: Total) -> dict[str, Any]:
    return {"key": total.key, "jobs": total.jobs, "gpu_hours": total.gpu_hours,
            "busy_ratio": total.busy_ratio, "wasted_gpu_hours": total.wasted_gpu_hours}


TOTAL_COLUMNS = ("key", "jobs", "gpu_hours", "busy_ratio", "wasted_gpu_hours")


def show(column: str, value: Any) -> str:
    """A value as people read it."""
    if value is None:
        return "-"
    if column in ("busy_ratio", "cpu_efficiency") or column.endswith("_ratio"):
        return f"{value:.1%}"
    if column.endswith("_gib"):
        return f"{value:.1f} GiB"
    if isinstance(value, float):
        return f"{value:.1f}"
    return str(value)


def when(t: float | None) -> str:
    """A time as UTC ISO 8601 to the minute, as every format prints it."""
    if t is None:
        return "-"
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M UTC")


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = round(seconds)
    days, rest = divmod(seconds, 86400)
    text = f"{rest // 3600:d}h{rest % 3600 // 60:02d}m"
    return f"{days}d {text}" if days else text


def low_util_title(report: LowUtilReport) -> str:
    return (f"Jobs under {report.threshold:.0%} GPU busy, {when(report.window.start)} - "
            f"{when(report.window.end)}")


def low_util_summary(report: LowUtilReport) -> str:
    wasted = sum(j.wasted_gpu_hours for j in report.flagged)
    return (f"{len(report.flagged)} of {report.jobs_seen} GPU jobs flagged, "
            f"{wasted:.1f} GPU-hours wasted; {report.queries} PromQL queries")


def job_header(detail: JobDetail) -> list[tuple[str, str]]:
    """The job's header as (label, value) pairs."""
    usage, acct = detail.usage, detail.accounting
    state = acct.state if acct and acct.state else ("RUNNING" if detail.running else "ENDED")
    if detail.running:
        state += " (in progress)"
    limit = acct.time_limit_s if acct else None
    return [
        ("Job", usage.shown + (f" ({usage.name})" if usage.name else "")),
        ("User", usage.user), ("Account", usage.account or "-"),
        ("Partition", usage.partition or "-"), ("State", state),
        ("Nodes", ", ".join(n.node for n in detail.nodes) or "-"),
        ("CPUs", show("cpus", detail.cpus)),
        ("Memory requested", _gib_or_dash(detail.memory_request)),
        ("GPUs", str(usage.gpus)),
        ("Start", when(detail.start)),
        ("Run time", duration(detail.elapsed_s)),
        ("Time limit", duration(limit) if limit else "-"),
    ]


def job_summary(detail: JobDetail) -> list[tuple[str, str]]:
    """The job's efficiency lines: GPU, CPU, memory, energy."""
    usage = detail.usage
    request = detail.memory_request
    peak = detail.memory_peak
    mem = _gib_or_dash(peak)
    if peak is not None and request:
        mem += f" of {request / GIB:.1f} GiB ({peak / request:.0%})"
    energy = detail.energy_j
    sm_active = []  # only where some GPU of the job has NVML GPM
    if usage.sm_active_ratio is not None:
        sm_active = [("GPU SM active", f"{show('sm_active_ratio', usage.sm_active_ratio)} over "
                                       f"{usage.gpm_allocated_s / 3600:.2f} GPU-hours with GPM")]
        sm_active += [(f.label, show("activity_ratio", ratio)) for f in gpm_activities()
                      if (ratio := usage.activity_ratio(f.job_attr)) is not None]
    sm_active += [(f.label, f.text.format(value)) for f in shown()
                  if f.label and (value := value_of(usage, f.job_attr)) is not None]
    return [
        ("GPU busy", f"{show('busy_ratio', usage.busy_ratio)} over {usage.gpu_hours:.2f} "
                     f"GPU-hours"),
        *([("GPU time unmeasured", f"{usage.unknown_s / 3600:.2f} GPU-hours (the driver's "
                                   "samples may have been lost: neither busy nor idle)")]
          if usage.unknown_s >= 36 else []),  # from 0.01 GPU-hours
        *sm_active,
        ("GPU memory peak", _gib_or_dash(usage.gpu_memory_peak)
         + (f" of {detail.gpu_memory_total / GIB:.0f} GiB" if detail.gpu_memory_total else "")),
        ("CPU efficiency", show("cpu_efficiency", detail.cpu_efficiency)
         + (f" of {detail.cpus} CPUs" if detail.cpus else "")),
        ("CPU memory peak", mem),
        ("GPU energy", f"{energy / 3.6e6:.3f} kWh" if energy is not None else "-"),
        *([("CPU and DRAM energy", f"{detail.cpu_energy_j / 3.6e6:.3f} kWh (share by CPU "
                                   "time, an estimate)")]
          if detail.cpu_energy_j is not None else []),
        *([("Emissions", f"{detail.emissions_gco2e:.0f} gCO2e at "
                         f"{detail.gco2e_per_kwh:g} gCO2e/kWh")]
          if detail.emissions_gco2e is not None else []),
        *[(f"GPU {name} throttled", text) for name, text in throttle_lines(detail)],
        *[("GPU error", line) for line in fault_lines(detail)],
    ]


def throttled_data(gpu: GpuDetail) -> dict[str, dict[str, float | None]]:
    """Per reason the GPU reports: seconds, share of the busy and of the held time."""
    held = gpu.allocated_s + (gpu.unknown_s or 0.0)
    return {t.reason: {"seconds": t.seconds, "busy_ratio": share(t.seconds, gpu.busy_s),
                       "held_ratio": share(t.seconds, held)} for t in gpu.throttled}


def slowed_ratio(gpu: GpuDetail) -> float | None:
    """The largest share of the GPU's busy time one slowing reason took."""
    shares = [share(t.seconds, gpu.busy_s) for t in gpu.throttled if t.reason in SLOWING]
    known = [s for s in shares if s is not None]
    return max(known) if known else None


def gpu_rows(detail: JobDetail) -> list[dict[str, Any]]:
    """Per node and GPU: busy ratio, memory peak against total, energy."""
    rows = []
    for node in detail.nodes:
        for gpu in node.gpus:
            rows.append({
                "node": node.node, "gpu": gpu.gpu, "uuid": gpu.uuid,
                "busy_ratio": gpu.busy_ratio, "sm_active_ratio": gpu.sm_active_ratio,
                **{f.ratio: gpu.activity_ratio(f.attr) for f in gpm_activities()},
                "power_mean_w": gpu.power_mean_w,
                "allocated_hours": gpu.allocated_s / 3600,
                "gpu_memory_total_gib": gpu.memory_total / GIB if gpu.memory_total else None,
                "slowed_ratio": slowed_ratio(gpu), "throttled": throttled_data(gpu),
                "errors": [{"kind": f.kind, "detail": f.detail, "count": f.count,
                            "last": f.last} for f in gpu.faults],
                **{f.json: json_value(value_of(gpu, f.attr), f) for f in shown()
                   if f.scope == "gpu"},
            })
    return rows


GPU_COLUMNS = ("node", "gpu", "busy_ratio", "sm_active_ratio", "allocated_hours",
               "gpu_memory_peak_gib", "gpu_memory_total_gib", "energy_kwh")
GPU_HEADINGS = {"node": "Node", "gpu": "GPU", "busy_ratio": "Busy", "sm_active_ratio": "SM active",
                "allocated_hours": "Held h", "gpu_memory_peak_gib": "Peak mem",
                "gpu_memory_total_gib": "Total mem", "energy_kwh": "Energy kWh",
                "uuid": "UUID"}


def show_gpu(column: str, value: Any) -> str:
    if column == "energy_kwh" and value is not None:
        return f"{value:.3f}"
    if column == "allocated_hours" and value is not None:
        return f"{value:.2f}"
    return show(column, value)


def _gib_or_dash(value: float | None) -> str:
    return f"{value / GIB:.1f} GiB" if value is not None else "-"
