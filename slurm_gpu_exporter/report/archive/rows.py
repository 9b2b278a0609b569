"""The job archive's rows and the report model: what one ended job is as rows of
``archive_jobs`` and ``archive_gpus``, and those rows as what the reports read."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from slurm_gpu_exporter.report.figures.gpu_events import GpuFault, Throttle
from slurm_gpu_exporter.report.figures.job_events import faults, xid_errors
from slurm_gpu_exporter.report.figures.shapes import (
    Accounting,
    GpuDetail,
    JobDetail,
    JobUsage,
    NodeDetail,
)
from slurm_gpu_exporter.report.figures.table import (
    archived,
    dict_reader,
    job_reader,
    set_value,
)

# What the archive keeps of each job, node and GPU (figures/table.py). A node's
# figures go in the job row's ``nodes`` JSON under their field names.
JOB_FIGURES = tuple(f for f in archived() if f.job_column)
NODE_FIGURES = tuple(f for f in archived() if f.scope == "node" and f.attr)
GPU_FIGURES = tuple(f for f in archived() if f.gpu_column)
# Each figure's value on the detail it is kept from, read the same way every time
_node_figures = dict_reader(NodeDetail, tuple((f.attr, f.attr) for f in NODE_FIGURES))
_gpu_figures = dict_reader(GpuDetail, tuple((f.gpu_column, f.attr) for f in GPU_FIGURES))
# a job's own figures (``job_attr``), and those summed over its nodes or GPUs
_usage_figures = dict_reader(JobUsage, tuple((f.job_column, f.job_attr)
                                             for f in JOB_FIGURES if f.job_attr))


_SUMMED = tuple((f.job_column, job_reader(f)) for f in JOB_FIGURES if not f.job_attr)


@dataclass
class ArchiveRecord:
    """One ended job as the archive stores it: its detail and its GPUs' models."""

    detail: JobDetail
    gpu_models: dict[tuple[str, str], str] = field(default_factory=dict)  # (node, gpu)


def month_of(t: float | None) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m") if t is not None else ""


def job_row(record: ArchiveRecord, archived_at: float) -> dict[str, Any]:
    """The ``archive_jobs`` row of one job."""
    d = record.detail
    u, acct = d.usage, d.accounting or Accounting()
    models = sorted(set(record.gpu_models.values()) - {""})
    return {
        "jobid": u.jobid, "cluster": u.cluster, "username": u.user,
        "account": u.account or acct.account, "partition": u.partition, "job_name": u.name,
        "nodes": json.dumps([{"node": n.node, **_node_figures(n)}
                             for n in d.nodes]),
        "node_count": len(d.nodes), "gpus": sum(len(n.gpus) for n in d.nodes),
        "gpu_model": ",".join(models),
        **_usage_figures(u),
        **{column: summed(d) for column, summed in _SUMMED},
        # Slurm accounting's times where the agent's series had none
        "start_time": d.start, "end_time": d.end,
        "end_month": month_of(d.end), "state": acct.state, "exit_code": acct.exit_code,
        "qos": acct.qos, "time_limit_s": acct.time_limit_s, "cpus": d.cpus,
        "requested_memory": d.memory_request, "requested_gpus": acct.requested_gpus,
        "gpm_allocated_s": u.gpm_allocated_s, "idle_gpus": u.idle_gpus,
        "cpu_efficiency": d.cpu_efficiency, "notes": json.dumps(d.notes),
        "archived_at": archived_at, "emissions_g": d.emissions_gco2e,
        # the agent's labels, kept only where they are Slurm's ids (a column is 16 wide)
        **_array_task(u),
        **_gpu_events(d),
    }


def _gpu_events(detail: JobDetail) -> dict[str, Any]:
    """The job's throttled seconds by reason and its error counts; NULL where no GPU
    had either counted (an agent from before them)."""
    xids = xid_errors(detail)
    if xids is None:
        return {"throttled": None, "xid_errors": None, "gpu_errors": None}
    throttled: dict[str, float] = {}
    errors: dict[str, float] = {}
    for node in detail.nodes:
        for gpu in node.gpus:
            for t in gpu.throttled:
                throttled[t.reason] = throttled.get(t.reason, 0.0) + t.seconds
    for _, fault in faults(detail):
        key = f"{fault.kind}:{fault.detail}" if fault.detail else fault.kind
        errors[key] = errors.get(key, 0.0) + fault.count
    return {"throttled": json.dumps(throttled, sort_keys=True), "xid_errors": xids,
            "gpu_errors": json.dumps(errors, sort_keys=True)}


def _gpu_event_columns(gpu: GpuDetail) -> dict[str, str | None]:
    if not gpu.throttled and not gpu.faults:
        return {"throttled": None, "gpu_errors": None}
    return {"throttled": json.dumps({t.reason: t.seconds for t in gpu.throttled},
                                    sort_keys=True),
            "gpu_errors": json.dumps([{"kind": f.kind, "detail": f.detail, "count": f.count,
                                       "last": f.last} for f in gpu.faults])}


def _gpu_events_of(row: Any) -> tuple[list[Throttle], list[GpuFault]]:
    """A GPU row's JSON columns as the detail's lists (empty before version 5)."""
    throttled = json.loads(row["throttled"]) if row.get("throttled") else {}
    errors = json.loads(row["gpu_errors"]) if row.get("gpu_errors") else []
    return ([Throttle(str(reason), float(s)) for reason, s in throttled.items()],
            [GpuFault(str(e["kind"]), str(e["detail"]), float(e["count"]),
                      e["last"] if e["last"] is None else float(e["last"])) for e in errors])


def _array_task(usage: JobUsage) -> dict[str, str]:
    if usage.shown == usage.jobid:
        return {"array_job_id": "", "array_task_id": ""}
    return {"array_job_id": usage.array_job_id, "array_task_id": usage.array_task_id}


def gpu_rows_of(record: ArchiveRecord) -> list[dict[str, Any]]:
    """The ``archive_gpus`` rows of one job."""
    u = record.detail.usage
    return [{"jobid": u.jobid, "cluster": u.cluster, "node": n.node, "gpu": g.gpu,
             "uuid": g.uuid, "model": record.gpu_models.get((n.node, g.gpu), ""),
             **_gpu_figures(g),
             **_gpu_event_columns(g)}
            for n in record.detail.nodes for g in n.gpus]


def usage_of(row: Any) -> JobUsage:
    """A job row as the usage the reports read."""
    usage = JobUsage(
        jobid=row["jobid"], user=row["username"], account=row["account"],
        partition=row["partition"], name=row["job_name"], cluster=row["cluster"],
        gpus=row["gpus"], idle_gpus=row["idle_gpus"], gpm_allocated_s=row["gpm_allocated_s"],
        array_job_id=row["array_job_id"], array_task_id=row["array_task_id"])
    for f in JOB_FIGURES:
        if f.job_attr:
            set_value(usage, f.job_attr, row[f.job_column])
    return usage


def detail_of(row: Any, gpu_rows: list[Any]) -> JobDetail:
    """A job row and its GPU rows as the detail ``job`` renders."""
    # a figure newer than the row (CPU energy before version 3) is absent: None
    nodes = [NodeDetail(node=n["node"]) for n in json.loads(row["nodes"])]
    for node, saved in zip(nodes, json.loads(row["nodes"]), strict=True):
        for f in NODE_FIGURES:
            set_value(node, f.attr, saved.get(f.attr))
    by_node = {n.node: n for n in nodes}
    for g in sorted(gpu_rows, key=lambda g: (g["node"], _gpu_order(g["gpu"]))):
        node = by_node.get(g["node"])
        if node is None:
            node = by_node[g["node"]] = NodeDetail(node=g["node"])
            nodes.append(node)
        throttled, gpu_faults = _gpu_events_of(g)
        gpu = GpuDetail(gpu=g["gpu"], uuid=g["uuid"], throttled=throttled, faults=gpu_faults)
        for f in GPU_FIGURES:
            set_value(gpu, f.attr, g[f.gpu_column])
        node.gpus.append(gpu)
    accounting = Accounting(
        state=row["state"], time_limit_s=row["time_limit_s"],
        requested_memory=row["requested_memory"], cpus=row["cpus"], nodes=row["node_count"],
        start=row["start_time"], end=row["end_time"], exit_code=row["exit_code"],
        account=row["account"], qos=row["qos"], requested_gpus=row["requested_gpus"])
    detail = JobDetail(usage=usage_of(row), nodes=nodes, accounting=accounting,
                       now=row["archived_at"], notes=json.loads(row["notes"]))
    # The factor the emissions were archived at (its mean over the job, where it varied),
    # so the detail shows the archived gCO2e, not today's factor's.
    kwh = detail.total_energy_kwh
    if row["emissions_g"] is not None and kwh:
        detail.gco2e_per_kwh = row["emissions_g"] / kwh
    return detail


def _gpu_order(gpu: str) -> tuple[int, ...]:
    return tuple(int(p) if p.isdigit() else 0 for p in gpu.split("."))
