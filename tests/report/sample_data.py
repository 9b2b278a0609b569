"""Fixed report data for the golden-output tests and the README screenshot."""

from __future__ import annotations

import math

from slurm_gpu_exporter.report.figures.gpu_events import GpuFault, Throttle
from slurm_gpu_exporter.report.figures.rules import low_util_note
from slurm_gpu_exporter.report.figures.shapes import (
    Accounting,
    GpuDetail,
    JobDetail,
    JobUsage,
    LowUtilReport,
    NodeDetail,
)
from slurm_gpu_exporter.report.figures.window import Window

GIB = 2**30
END = 1_796_025_600.0  # 2026-11-30 08:00 UTC
START = END - 7 * 86400
H = 3600.0

# (jobid, user, account, name, gpus, hours held per GPU, busy ratio, idle GPUs, GPU mem GiB)
FLAGGED = [
    ("81234", "carol", "ml", "sweep-17", 4, 30.0, 0.02, 3, 6.5),
    ("81301", "dave", "ml", "llm-eval", 8, 9.5, 0.11, 4, 38.0),
    ("80977", "erin", "bio", "fold-batch", 2, 26.0, 0.0, 2, 0.0),
    ("81410", "bob", "chem", "md-gpu", 1, 40.0, 0.08, 0, 3.1),
    ("81502", "carol", "ml", "notebook", 1, 22.0, 0.01, 0, 1.2),
    ("81555", "alice", "physics", "lattice", 2, 6.0, 0.21, 1, 12.0),
]


def low_util_report() -> LowUtilReport:
    flagged = []
    for i, (jobid, user, account, name, gpus, hours, ratio, idle, mem) in enumerate(FLAGGED):
        held = gpus * hours * H
        flagged.append(JobUsage(
            jobid=jobid, user=user, account=account, partition="gpu", name=name, gpus=gpus,
            allocated_s=held, busy_s=held * ratio, idle_gpus=idle,
            gpu_memory_peak=mem * GIB, start=START + 3 * H * (i + 1),
            end=START + 3 * H * (i + 1) + hours * H))
    flagged.sort(key=lambda j: (-j.wasted_gpu_hours, j.jobid))
    # llm-eval's GPUs were power-capped 40 % of the time they were busy
    slowed = next(j for j in flagged if j.jobid == "81301")
    slowed.slowed_reason, slowed.slowed_s = "power", 0.4 * slowed.busy_s
    timelines = {}
    for job in flagged:
        assert job.start is not None and job.end is not None
        ratio = job.busy_ratio or 0.0
        steps = 40
        timelines[job.jobid] = [
            (job.start + (job.end - job.start) * k / steps,
             max(0.0, min(1.0, ratio * (1 + 0.8 * math.sin(k / 3 + len(job.jobid))))))
            for k in range(steps + 1)]
    ratios = [r for r in (j.busy_ratio for j in flagged) if r is not None]
    ratios += [0.35, 0.42, 0.55, 0.61, 0.68, 0.72, 0.77, 0.81, 0.83, 0.86, 0.88, 0.9, 0.91,
               0.93, 0.95, 0.97, 0.99, 0.58, 0.74, 0.89]
    notes = {j.jobid: note for j in flagged if (note := low_util_note(j, 0.2)) is not None}
    return LowUtilReport(window=Window(START, END), threshold=0.25, jobs_seen=len(ratios),
                         flagged=flagged, queries=11, timelines=timelines, all_ratios=ratios,
                         notes=notes)


def empty_low_util_report() -> LowUtilReport:
    return LowUtilReport(window=Window(START, END), threshold=0.25, jobs_seen=3, flagged=[],
                         queries=9)


def job_details() -> list[JobDetail]:
    idle = JobDetail(
        usage=JobUsage("80977", user="erin", account="bio", partition="gpu",
                       name="fold-batch", gpus=2, allocated_s=2 * 26 * H, busy_s=0.0,
                       idle_gpus=2, gpu_memory_peak=0.0, start=START + 9 * H,
                       end=START + 35 * H),
        nodes=[NodeDetail("gpu07", cpus=16, cpu_s=16 * 26 * H * 0.04, memory_peak=9.5 * GIB,
                          memory_limit=128 * GIB,
                          gpus=[GpuDetail(str(g), f"GPU-7a{g}", 26 * H, 0.0, 0.0, 80 * GIB,
                                          26 * H * 62.0) for g in (2, 3)])],
        accounting=Accounting(state="COMPLETED", time_limit_s=48 * H,
                              requested_memory=128 * GIB, cpus=16, nodes=1),
        now=END)
    busy = JobDetail(
        usage=JobUsage("81601", user="alice", account="physics", partition="gpu",
                       name="train-vit", gpus=4, allocated_s=4 * 10 * H, busy_s=4 * 10 * H *
                       0.87, idle_gpus=0, gpu_memory_peak=71.3 * GIB, start=END - 10 * H,
                       sm_active_s=10 * H * 0.72, gpm_allocated_s=2 * 10 * H),
        nodes=[NodeDetail(node, cpus=32, cpu_s=32 * 10 * H * 0.81, memory_peak=180 * GIB,
                          memory_limit=256 * GIB,
                          gpus=[GpuDetail(str(g), f"GPU-{node}-{g}", 10 * H,
                                          10 * H * (0.85 + 0.01 * g), (68 + g) * GIB,
                                          80 * GIB, 10 * H * 540.0,
                                          # GPM on gpu11 only: "busy" 85 %, SMs 31-41 %
                                          10 * H * (0.31 + 0.1 * g) if node == "gpu11" else None)
                                for g in (0, 1)])
               for node in ("gpu11", "gpu12")],
        accounting=Accounting(state="RUNNING", time_limit_s=24 * H,
                              requested_memory=512 * GIB, cpus=64, nodes=2),
        now=END)
    # What slowed train-vit's GPUs: gpu12's GPU 1 power-capped a quarter of its busy
    # time, a little thermal throttling on both of gpu12's; one Xid 79 on gpu11's GPU 0.
    for gpu in busy.nodes[1].gpus:
        gpu.throttled = [Throttle("power", 0.25 * gpu.busy_s if gpu.gpu == "1" else 0.0),
                         Throttle("thermal", 0.02 * gpu.busy_s),
                         Throttle("low_utilization", 0.1 * (gpu.allocated_s - gpu.busy_s))]
    busy.nodes[0].gpus[0].throttled = [Throttle("power", 0.0)]
    busy.nodes[0].gpus[0].faults = [GpuFault("xid", "79", 1, END - 2 * H - 17 * 60),
                                    GpuFault("ecc", "uncorrected", 2)]
    return [idle, busy]
