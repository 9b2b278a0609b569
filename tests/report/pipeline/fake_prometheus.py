"""A stand-in Prometheus client that answers each PromQL text from fixed jobs.

It reads only the query's text: the metric it selects (the first ``slurm_…`` name), a
baseline (``offset``), and a ``by (jobid`` grouping (``low-util``'s server-side sums).
So it answers the same whatever names the report gives its queries, and records every
query sent, in order.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from slurm_gpu_exporter.report.prometheus.client import Sample, Series

END = 1_796_025_600.0  # 2026-11-30 08:00 UTC
H = 3600.0
GIB = 2.0**30

# (jobid, user, account, name, start offset before END, length, nodes: {instance: gpus})
JOBS = [
    ("501", "alice", "physics", "lattice", 30 * H, 20 * H,
     {"gpu01:9400": 2, "gpu02:9400": 2}),
    ("502", "bob", "ml", "sweep", 10 * H, 8 * H, {"gpu03:9400": 1}),
    ("503", "carol", "bio", "fold", 50 * H, 46 * H, {"gpu01:9400": 1}),  # started before
]
ARRAY = {"502": ("500", "2")}  # job 502 is task 2 of array 500
BUSY = {"501": 0.62, "502": 0.04, "503": 0.0}
GPM = {"gpu01:9400"}  # GPUs there measure SM, tensor and DRAM activity (NVML GPM)
METRIC_RE = re.compile(r"slurm_[a-z_]+")


@dataclass
class FakePrometheus:
    """``instant``/``range`` as ``PrometheusClient`` has them, over ``JOBS``."""

    window_start: float = END - 24 * H
    sent: list[str] = field(default_factory=list)
    queries: int = 0

    async def instant(self, query: str, at: float) -> list[Sample]:
        self.sent.append(query)
        self.queries += 1
        return answer(query, self.window_start)

    async def range(self, query: str, start: float, end: float, step: float) -> list[Series]:
        self.sent.append(query)
        self.queries += 1
        ids = re.findall(r"\d{3}", query.split("jobid=~", 1)[1].split('"', 2)[1])
        return [Series({"jobid": j}, [(start + k * step, min(1.0, BUSY[j] * (1 + k % 3)))
                                      for k in range(4)]) for j in ids]


def _held(job: tuple, t: float) -> float:  # type: ignore[type-arg]
    """Seconds the job had run at ``t`` (0 before it started)."""
    start = END - job[4]
    return max(0.0, min(t, start + job[5]) - start)


def _gpus(job: tuple) -> list[tuple[str, str, str]]:  # type: ignore[type-arg]
    return [(instance, str(g), f"GPU-{instance[:5]}-{g}") for instance, n in job[6].items()
            for g in range(n)]


def _per_gpu(metric: str, job: tuple, instance: str, gpu: str, t: float) -> float | None:  # type: ignore[type-arg]
    held = _held(job, t)
    scale = 1.0 + int(gpu) * 0.1
    busy = BUSY[job[0]] * held * scale
    values = {
        "slurm_job_gpu_allocated_seconds_total": held,
        "slurm_job_gpu_unknown_seconds_total": held * 0.02,
        "slurm_job_gpu_busy_seconds_total": busy,
        "slurm_job_gpu_energy_joules_total": held * (80 + 250 * BUSY[job[0]]) * scale,
        "slurm_job_gpu_memory_peak_bytes": (4 + 30 * BUSY[job[0]]) * GIB * scale,
        "slurm_job_gpu_sm_active_seconds_total": busy * 0.8,
        "slurm_job_gpu_tensor_active_seconds_total": busy * 0.3,
        "slurm_job_gpu_dram_active_seconds_total": busy * 0.45,
    }
    if metric in ("slurm_job_gpu_sm_active_seconds_total",
                  "slurm_job_gpu_tensor_active_seconds_total",
                  "slurm_job_gpu_dram_active_seconds_total") and instance not in GPM:
        return None
    return values.get(metric)


def _per_node(metric: str, job: tuple, instance: str, t: float) -> float | None:  # type: ignore[type-arg]
    held = _held(job, t)
    cpus = 16.0 * job[6][instance]
    return {
        "slurm_job_start_time_seconds": END - job[4],
        "slurm_job_end_time_seconds": END - job[4] + job[5],
        "slurm_job_cpus": cpus,
        "slurm_job_cpu_seconds_total": held * cpus * 0.35,
        "slurm_job_memory_peak_bytes": 40 * GIB * job[6][instance],
        "slurm_job_memory_limit_bytes": 128 * GIB * job[6][instance],
    }.get(metric)


def _info(job: tuple, instance: str) -> dict[str, str]:  # type: ignore[type-arg]
    labels = {"jobid": job[0], "user": job[1], "account": job[2], "partition": "gpu",
              "name": job[3], "instance": instance, "slurm_node": instance.split(":")[0]}
    if job[0] in ARRAY:
        labels["array_job_id"], labels["array_task_id"] = ARRAY[job[0]]
    return labels


def _job_scope(metric: str, t: float) -> list[Sample]:
    out = []
    for job in JOBS:
        if _held(job, t) <= 0 and metric != "slurm_job_info":
            continue
        for instance in job[6]:
            base = {"jobid": job[0], "user": job[1], "instance": instance}
            if metric == "slurm_job_info":
                out.append(Sample(_info(job, instance), 1.0))
            elif metric == "slurm_job_cpu_energy_joules_total":
                held = _held(job, t)
                out += [Sample({**base, "domain": "package"}, held * 95.0),
                        Sample({**base, "domain": "dram"}, held * 12.0)]
            elif (value := _per_node(metric, job, instance, t)) is not None:
                out.append(Sample(base, value))
        for instance, gpu, uuid in _gpus(job):
            labels = {"jobid": job[0], "user": job[1], "instance": instance, "gpu": gpu,
                      "uuid": uuid}
            if metric == "slurm_gpu_memory_total_bytes":
                out.append(Sample({"instance": instance, "uuid": uuid}, 80 * GIB))
            elif metric == "slurm_gpu_info":
                out.append(Sample({"instance": instance, "uuid": uuid,
                                   "name": "NVIDIA H100 80GB HBM3"}, 1.0))
            elif metric == "slurm_job_gpu_throttled_seconds_total":
                held = _held(job, t)
                out += [Sample({**labels, "reason": "power", "event": "throttled"}, held * 0.1),
                        Sample({**labels, "reason": "thermal", "event": "throttled"},
                               held * 0.01)]
                if job[0] == "501" and gpu == "1":
                    out.append(Sample({**labels, "xid": "79", "event": "xid"},
                                      2.0 if t >= END - 24 * H else 1.0))
                    out.append(Sample({**labels, "xid": "79", "event": "xid_last"},
                                      END - 5 * H))
            elif (value := _per_gpu(metric, job, instance, gpu, t)) is not None:
                out.append(Sample(labels, value))
    return out


def _grouped(query: str, metric: str, t: float) -> list[Sample]:
    """``low-util``'s sums by job (count of never-busy GPUs for ``count by``)."""
    totals: dict[tuple[str, ...], float] = {}
    labels: dict[tuple[str, ...], dict[str, str]] = {}
    peak = query.startswith("max by")
    for s in _job_scope(metric, t):
        if query.startswith("count by") and (metric != "slurm_job_gpu_busy_seconds_total"
                                              or s.value > 0):
            continue
        key = tuple(s.labels.get(k, "") for k in ("jobid", "reason"))
        if query.startswith("group by"):
            labels[key] = {k: v for k, v in s.labels.items() if k not in ("instance",
                                                                        "slurm_node")}
            totals[key] = 1.0
            continue
        labels[key] = {"jobid": s.labels["jobid"], **({"reason": s.labels["reason"]}
                                                       if "reason" in s.labels else {})}
        add = 1.0 if query.startswith("count by") else s.value
        totals[key] = max(totals.get(key, 0.0), add) if peak else totals.get(key, 0.0) + add
    return [Sample(labels[k], v) for k, v in sorted(totals.items())]


def answer(query: str, window_start: float) -> list[Sample]:
    metric = METRIC_RE.search(query)
    if metric is None:
        return []
    name = metric.group(0)
    at = window_start if " offset " in query and "idle" not in query else END
    if "by (jobid" in query:
        if "jobid=~" in query and "count by" in query:  # idle before the window
            return []
        return _grouped(query, name, at)
    if "reason=~" in query:
        name = "slurm_job_gpu_throttled_seconds_total"
    return _job_scope(name, at)
