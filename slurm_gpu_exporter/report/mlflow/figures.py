"""A job's figures as MLflow metrics (``slurm.<figure>``) and tags. Pure: no I/O.

The numbers are those of ``slurm-gpu-report job JOBID --format json`` (the same
``JobDetail``), in base units: bytes, joules, grams, seconds. A figure the job does
not have (SM activity without GPM, emissions without a factor) is left out, never 0.
"""

from __future__ import annotations

import math
import re

from slurm_gpu_exporter.report.figures.shapes import JobDetail
from slurm_gpu_exporter.report.figures.table import FIGURES, job_value

PREFIX = "slurm."
# A throttle reason as part of a metric's name: what MLflow keys allow, bounded.
_REASON_RE = re.compile(r"[A-Za-z0-9_]{1,40}")


def throttled_seconds(detail: JobDetail) -> dict[str, float]:
    """GPU-seconds the job's GPUs were throttled, by reason, summed over its GPUs (the
    report's own per-GPU figures; empty where the agent does not measure it)."""
    total: dict[str, float] = {}
    for node in detail.nodes:
        for gpu in node.gpus:
            for t in gpu.throttled:
                total[t.reason] = total.get(t.reason, 0.0) + t.seconds
    return total


def run_metrics(detail: JobDetail) -> dict[str, float]:
    """The job's figures by metric name, with the throttled share of the GPU-hours by
    reason where the agent measures it."""
    usage = detail.usage
    throttled_s = throttled_seconds(detail)
    figures: dict[str, float | None] = {
        "gpus": usage.gpus,
        "gpu_hours": usage.gpu_hours,
        "gpu_busy_ratio": usage.busy_ratio,
        "wasted_gpu_hours": usage.wasted_gpu_hours,
        "idle_gpus": usage.idle_gpus,
        # the GPM activities as shares of the time held on GPUs that measure them, the
        # other figures of the table as the job's values
        **{f.mlflow: usage.activity_ratio(f.job_attr) if f.combine == "gpm"
           else job_value(detail, f) for f in FIGURES if f.mlflow},
        "emissions_grams": detail.emissions_gco2e,
        "run_time_seconds": detail.elapsed_s,
        "cpu_efficiency_ratio": detail.cpu_efficiency,
        "unmeasured_gpu_hours": usage.unknown_s / 3600,
    }
    if throttled_s and usage.allocated_s > 0:
        for reason, seconds in sorted(throttled_s.items()):
            if _REASON_RE.fullmatch(reason):
                figures[f"gpu_throttled_ratio.{reason}"] = min(1.0, seconds / usage.allocated_s)
    return {PREFIX + name: float(value) for name, value in figures.items()
            if value is not None and math.isfinite(value)}


def run_tags(detail: JobDetail) -> dict[str, str]:
    """What the job was, as tags beside its figures (the job's own words stay plain)."""
    usage = detail.usage
    tags = {"slurm.job": usage.shown, "slurm.user": usage.user, "slurm.account": usage.account,
            "slurm.partition": usage.partition}
    if detail.accounting and detail.accounting.state:
        tags["slurm.state"] = detail.accounting.state
    if detail.accounting and detail.accounting.exit_code:
        tags["slurm.exit_code"] = detail.accounting.exit_code
    return {k: v for k, v in tags.items() if v}
