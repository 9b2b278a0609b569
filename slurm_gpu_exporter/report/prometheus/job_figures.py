"""The PromQL of the job figures (``figures/table.py``) and the detail built from it.

``job`` and ``archive`` ask the same figures: one instant query per figure (two for
a counter in ``job``: its value at the window's start is subtracted, since the job may
have started before), plus the job's info series and its GPUs' slow-downs and errors.
The answers become the per-node and per-GPU detail by the rows alone: a figure's
``attr`` names the field it fills and ``combine`` how the job sums it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from slurm_gpu_exporter.report.figures.shapes import GpuDetail, JobUsage, NodeDetail
from slurm_gpu_exporter.report.figures.table import (
    FIGURES,
    Figure,
    reader,
    set_value,
    value_of,
)
from slurm_gpu_exporter.report.figures.window import Window
from slurm_gpu_exporter.report.prometheus.client import PrometheusClient, Sample, gather
from slurm_gpu_exporter.report.prometheus.figure_promql import (
    BASELINE_LOOKBACK,
    DEVICE_KEYS,
    HELD,
    figure_queries,
)
from slurm_gpu_exporter.report.prometheus.gpu_events import events_query, gpu_events
from slurm_gpu_exporter.report.prometheus.nodes import shown_nodes
from slurm_gpu_exporter.report.prometheus.queries import (
    Filters,
    jobid_regex,
    selector,
    with_node,
)

NODE_KEYS = ("jobid", "instance")
GPU_KEYS = ("jobid", "instance", "gpu", "uuid")
INFO = "slurm_job_info"

def job_queries(window: Window, jobids: list[str], filters: Filters) -> dict[str, str]:
    """The instant queries of ``job``: per node and GPU, for the given jobs."""
    equal = filters.matchers()
    ids = {"jobid": jobid_regex(jobids)}
    d = window.range

    def s(metric: str) -> str:
        return selector(metric, equal, ids)

    def base(metric: str) -> str:
        return f"last_over_time({s(metric)}[{BASELINE_LOOKBACK}] offset {d})"

    return {
        "info": with_node(f"last_over_time({s(INFO)}[{d}])", filters, d),
        **figure_queries(FIGURES, s, d, lambda m: selector(m, equal), held=True,
                         baselines=True),
        # throttled time by reason and GPU errors: one query (prometheus/gpu_events.py)
        "gpu_events": events_query(lambda m: f"max_over_time({s(m)}[{d}])"),
        "gpu_events_base": events_query(base, with_last=False),
    }


async def fetch_jobs(prom: PrometheusClient, window: Window, jobids: list[str],
                     filters: Filters) -> dict[str, tuple[JobUsage, list[NodeDetail]]]:
    """The named jobs' usage and per-node detail; a job Prometheus does not know is absent."""
    queries = job_queries(window, jobids, filters)
    answers = await gather(*(prom.instant(q, window.end) for q in queries.values()))
    found = jobs_from_answers(dict(zip(queries, answers, strict=True)), filters)
    return {jobid: job for (_, jobid), job in found.items()}


def _values(got: dict[str, list[Sample]], fig: Figure) -> dict[tuple[str, ...], float]:
    """The figure's value per node or GPU key; a counter's value at the window's start
    subtracted (where its series are split, as CPU energy by RAPL domain, split by split
    and the differences summed)."""
    keys = DEVICE_KEYS if fig.shape == "device" else GPU_KEYS if fig.scope == "gpu" \
        else NODE_KEYS
    labels = (*keys, fig.split) if fig.split else keys

    def per(name: str) -> dict[tuple[str, ...], float]:
        return {tuple([s.labels.get(k, "") for k in labels]): s.value
                for s in got.get(name, [])}

    now = per(fig.name)
    if fig.shape != "counter":
        return now
    before = per(f"{fig.name}_base")
    if not fig.split:
        return {key: max(0.0, value - before.get(key, 0.0)) for key, value in now.items()}
    out: dict[tuple[str, ...], float] = {}
    for key, value in now.items():
        out[key[:len(keys)]] = (out.get(key[:len(keys)], 0.0)
                                + max(0.0, value - before.get(key, 0.0)))
    return out


def jobs_from_answers(got: dict[str, list[Sample]], filters: Filters
                      ) -> dict[tuple[str, str], tuple[JobUsage, list[NodeDetail]]]:
    """Jobs by (cluster, jobid) from the answers to ``job_queries`` (a ``*_base`` answer
    left out counts as 0: the window holds the whole job)."""
    values = {fig.name: _values(got, fig) for fig in FIGURES}
    events = gpu_events(got.get("gpu_events", []), got.get("gpu_events_base", []))
    found: dict[tuple[str, str], tuple[JobUsage, list[NodeDetail]]] = {}
    # The same job on the same target twice: its metadata changed (spool record found).
    # An info series that names the array task wins (see queries._by_job).
    infos = {(s.labels.get("jobid", ""), s.labels.get("instance", "")): s for s in
             sorted(got["info"], key=lambda s: bool(s.labels.get("array_job_id")))}
    gpus_of: dict[tuple[str, ...], list[tuple[str, ...]]] = {}  # (jobid, instance) -> GPUs
    for gkey in values[HELD]:
        gpus_of.setdefault(gkey[:2], []).append(gkey)
    shown = shown_nodes(got["info"])
    node_args, gpu_args = _found("node", values), _found("gpu", values)
    for (jobid, instance), info in sorted(infos.items()):
        cluster = info.labels.get(filters.cluster_label, "")
        if (cluster, jobid) not in found:
            found[cluster, jobid] = (JobUsage(
                jobid=jobid, user=info.labels.get("user", ""),
                account=info.labels.get("account", ""),
                partition=info.labels.get("partition", ""), name=info.labels.get("name", ""),
                array_job_id=info.labels.get("array_job_id", ""),
                array_task_id=info.labels.get("array_task_id", ""), cluster=cluster), [])
        usage, nodes = found[cluster, jobid]
        key = (jobid, instance)
        node = NodeDetail(node=shown[instance], target=instance,
                          **node_args.get(key, {}))
        for gkey in sorted(gpus_of.get(key, []), key=_gpu_order):
            throttled, faults = events.get(gkey, ([], []))
            node.gpus.append(GpuDetail(gpu=gkey[2], uuid=gkey[3], throttled=throttled,
                                       faults=faults,
                                       **_device(values, gkey, gpu_args.get(gkey, {}))))
        nodes.append(node)
        add_node(usage, node, {f.name: values[f.name][key] for f in _NODE_FIGURES
                               if key in values[f.name]})
    return found


# Per scope, the figures a node or GPU detail holds, read once per detail: (name, read
# by device, a count, field, a field of its own or one of ``more``).
_FIELDS = {"node": {f.name for f in dataclasses.fields(NodeDetail)},
           "gpu": {f.name for f in dataclasses.fields(GpuDetail)}}
_HELD_BY = {scope: tuple((f.name, f.shape == "device", f.whole, f.attr, f.attr in _FIELDS[scope])
                         for f in FIGURES if f.scope == scope and f.attr)
            for scope in ("node", "gpu")}
_COMBINED = tuple(f for f in FIGURES if f.combine)
_NODE_FIGURES = tuple(f for f in FIGURES if f.scope == "node")


def _found(scope: str, values: dict[str, dict[tuple[str, ...], float]]
           ) -> dict[tuple[str, ...], dict[str, Any]]:
    """Each node's or GPU's figures that the answers hold, by field (``more`` holds the
    others): the detail's constructor arguments, by its key. A device's figure is
    read by ``_device``: two jobs' GPUs share it."""
    found: dict[tuple[str, ...], dict[str, Any]] = {}
    for name, by_device, whole, attr, own in _HELD_BY[scope]:
        if by_device:
            continue
        for key, value in values[name].items():
            args = found.get(key)
            if args is None:
                args = found[key] = {}
            if whole:
                value = int(value)
            if own:
                args[attr] = value
            elif "more" in args:
                args["more"][attr] = value
            else:
                args["more"] = {attr: value}
    return found


def _device(values: dict[str, dict[tuple[str, ...], float]], gkey: tuple[str, ...],
            args: dict[str, Any]) -> dict[str, Any]:
    """A GPU's constructor arguments with its device's figures (by target and UUID)."""
    for name, by_device, whole, attr, own in _HELD_BY["gpu"]:
        if by_device and (value := values[name].get((gkey[1], gkey[3]))) is not None:
            value = int(value) if whole else value
            if own:
                args[attr] = value
            else:
                args["more"] = {**args.get("more", {}), attr: value}
    return args


def _gpu_order(key: tuple[str, ...]) -> tuple[int, ...]:
    return tuple(int(p) if p.isdigit() else 0 for p in key[2].split("."))


_USAGE_FIELDS = {f.name for f in dataclasses.fields(JobUsage)}


def _combining(fig: Figure) -> tuple[Any, ...]:
    """How ``add_node`` adds one figure to the job: (name, from the node, over the GPUs
    that measure GPM, the GPU's reader, combine, the job's field, a field of its own)."""
    return (fig.name, fig.scope == "node", fig.combine == "gpm",
            reader(GpuDetail, fig.attr) if fig.scope == "gpu" else None, fig.combine,
            fig.job_attr, fig.job_attr in _USAGE_FIELDS)


_COMBINING = tuple(_combining(f) for f in _COMBINED)


def add_node(usage: JobUsage, node: NodeDetail, node_values: dict[str, float]) -> None:
    """Add one node (its GPUs, and its own figures such as start and end) to the job."""
    usage.gpus += len(node.gpus)
    measured = [g for g in node.gpus if g.sm_active_s is not None]  # GPUs with GPM
    usage.gpm_allocated_s += sum(g.allocated_s for g in measured)
    for name, of_node, gpm, read, combine, attr, own in _COMBINING:
        if of_node:
            if name not in node_values:
                continue
            known = [node_values[name]]
        else:
            known = [v for g in (measured if gpm else node.gpus) if (v := read(g)) is not None]
            if not known:
                continue
        # the builtins where the job has a field (thousands of jobs): the same as value_of
        now = getattr(usage, attr) if own else value_of(usage, attr)
        if combine == "sum" or combine == "gpm":
            total = (now or 0.0) + sum(known)
        elif combine == "max":
            total = max([*known, now or 0.0])
        else:  # min
            total = min(known) if now is None else min([*known, now])
        if own:
            setattr(usage, attr, total)
        else:
            set_value(usage, attr, total)
    usage.idle_gpus += sum(1 for g in node.gpus if g.allocated_s > 0 and g.busy_s <= 0)
