"""The PromQL behind each report, and the records built from the answers.

Every query is an instant query at the window's end over the whole window, so a
report costs the same fixed number of queries whatever the number of jobs.

Per-job counters start at 0 when the job starts, so a series' largest value in
the window is its total when the job started inside the window. For a job that
started before, the value at the window's start (``last_over_time(...) offset``)
is subtracted: both are summed by job server-side and subtracted here, which is
exact because a sum of differences is the difference of the sums.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from slurm_gpu_exporter.model.ids import JOB_ID_CHARS
from slurm_gpu_exporter.report.errors import ReportError
from slurm_gpu_exporter.report.figures.gpu_events import SLOWING
from slurm_gpu_exporter.report.figures.shapes import GpuDetail, JobUsage, NodeDetail
from slurm_gpu_exporter.report.figures.window import Window
from slurm_gpu_exporter.report.prometheus.client import PrometheusClient, Sample, gather
from slurm_gpu_exporter.report.prometheus.gpu_events import THROTTLED, events_query, gpu_events
from slurm_gpu_exporter.report.prometheus.nodes import NODE_INFO, join_node, shown_nodes

ALLOCATED = "slurm_job_gpu_allocated_seconds_total"
UNKNOWN = "slurm_job_gpu_unknown_seconds_total"  # held, not measured: not in ALLOCATED
BUSY = "slurm_job_gpu_busy_seconds_total"
ENERGY = "slurm_job_gpu_energy_joules_total"
CPU_ENERGY = "slurm_job_cpu_energy_joules_total"  # by domain: package, dram
SM_ACTIVE = "slurm_job_gpu_sm_active_seconds_total"
TENSOR_ACTIVE = "slurm_job_gpu_tensor_active_seconds_total"
DRAM_ACTIVE = "slurm_job_gpu_dram_active_seconds_total"
CPU = "slurm_job_cpu_seconds_total"
# How far before the window's start a counter's value still counts as its value there.
BASELINE_LOOKBACK = "5m"
TIMELINE_POINTS = 120

_JOBID_RE = re.compile(JOB_ID_CHARS)


@dataclass(frozen=True)
class Filters:
    """Which jobs a report covers; ``user`` and ``cluster`` are matched in PromQL."""

    user: str | None = None
    account: str | None = None
    partition: str | None = None
    cluster: str | None = None
    cluster_label: str = "cluster"

    def matchers(self) -> dict[str, str]:
        found = {}
        if self.user:
            found["user"] = self.user
        if self.cluster:
            found[self.cluster_label] = self.cluster
        return found


def _quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def selector(metric: str, equal: dict[str, str], regex: dict[str, str] | None = None) -> str:
    """``metric{a="x",b=~"y"}`` with values quoted safely."""
    parts = [f"{k}={_quote(v)}" for k, v in sorted(equal.items())]
    parts += [f"{k}=~{_quote(v)}" for k, v in sorted((regex or {}).items())]
    return metric + ("{" + ",".join(parts) + "}" if parts else "")


def jobid_regex(jobids: Iterable[str]) -> str:
    """An anchored alternation of job ids; ReportError for one that is not an id."""
    ids = list(jobids)
    for jobid in ids:
        if not _JOBID_RE.fullmatch(jobid):
            raise ReportError(f"bad job id {jobid!r}: use the number Slurm gave the job")
    return "|".join(re.escape(j) for j in ids)


# --- low-util -----------------------------------------------------------------------


def low_util_queries(window: Window, filters: Filters) -> dict[str, str]:
    """The first instant queries of ``low-util``, by name; each summed by job server-side.

    Each query decodes every sample of its metric in the window, so there are as few
    as the columns need: no start or end time (``job`` shows those).
    """
    sel = filters.matchers()
    by = f"jobid, {filters.cluster_label}"
    d = window.range

    def s(metric: str) -> str:
        return selector(metric, sel)

    # Throttled GPU-seconds by slowing reason, the baseline subtracted server-side.
    slowed = selector(THROTTLED, sel, {"reason": "|".join(SLOWING)})
    return {
        "info": f"group by ({by}, user, account, partition, name, array_job_id, "
                f"array_task_id) "
                f"(last_over_time({s('slurm_job_info')}[{d}]))",
        "gpus": f"sum by ({by}) (max_over_time({s('slurm_job_gpus')}[{d}]))",
        "allocated": f"sum by ({by}) (max_over_time({s(ALLOCATED)}[{d}]))",
        "allocated_base": f"sum by ({by}) "
                          f"(last_over_time({s(ALLOCATED)}[{BASELINE_LOOKBACK}] offset {d}))",
        "busy": f"sum by ({by}) (max_over_time({s(BUSY)}[{d}]))",
        "busy_base": f"sum by ({by}) "
                     f"(last_over_time({s(BUSY)}[{BASELINE_LOOKBACK}] offset {d}))",
        # GPUs never busy since their job started in the window. A job that started
        # before also has GPUs whose counter stood still in the window; those are
        # counted by idle_before_query, over those jobs alone.
        "idle_gpus": f"count by ({by}) (max_over_time({s(BUSY)}[{d}]) == 0)",
        "gpu_memory_peak": f"max by ({by}) "
                           f"(max_over_time({s('slurm_job_gpu_memory_peak_bytes')}[{d}]))",
        "slowed": f"sum by ({by}, reason) (max_over_time({slowed}[{d}]) - (last_over_time("
                  f"{slowed}[{BASELINE_LOOKBACK}] offset {d}) or max_over_time({slowed}[{d}])"
                  " * 0))",
    }


def idle_before_query(window: Window, filters: Filters, jobids: list[str]) -> str:
    """GPUs of jobs running at the window's start, busy before it and never in it.

    Selecting those jobs by id keeps this query cheap: only the jobs running at the
    start are decoded, not all of the window's."""
    sel = filters.matchers()
    by = f"jobid, {filters.cluster_label}"
    d = window.range
    busy = selector(BUSY, sel, {"jobid": jobid_regex(jobids) if jobids else "^$"})
    return (f"count by ({by}) (max_over_time({busy}[{d}]) - last_over_time({busy}"
            f"[{BASELINE_LOOKBACK}] offset {d}) == 0 and max_over_time({busy}[{d}]) > 0)")


def _by_job(samples: list[Sample], cluster_label: str) -> dict[tuple[str, str], Sample]:
    # An info series that names the job's array task wins over one that does not (an
    # agent that learnt it from Slurm after the prolog's record had none).
    ordered = sorted(samples, key=lambda s: bool(s.labels.get("array_job_id")))
    return {(s.labels.get(cluster_label, ""), s.labels.get("jobid", "")): s for s in ordered}


async def fetch_usage(prom: PrometheusClient, window: Window, filters: Filters
                      ) -> list[JobUsage]:
    """Every job that held GPUs in the window, with its usage there (account/partition
    filters applied). Always ``len(low_util_queries()) + 1`` queries."""
    queries = low_util_queries(window, filters)
    answers = dict(zip(queries, await gather(*(prom.instant(q, window.end)
                                              for q in queries.values())), strict=True))
    got = {name: _by_job(a, filters.cluster_label) for name, a in answers.items()}
    running_at_start = sorted({jobid for _, jobid in got["busy_base"]})
    idle_before = _by_job(await prom.instant(
        idle_before_query(window, filters, running_at_start), window.end),
        filters.cluster_label)

    slowed = _top_reason(answers["slowed"], filters.cluster_label)  # by reason too

    def value(name: str, key: tuple[str, str]) -> float | None:
        sample = got[name].get(key)
        return sample.value if sample is not None else None

    jobs = []
    for key, allocated in got["allocated"].items():
        info = got["info"].get(key)
        labels = info.labels if info is not None else allocated.labels
        before = idle_before.get(key)
        job = JobUsage(
            jobid=key[1], cluster=key[0], user=labels.get("user", ""),
            account=labels.get("account", ""), partition=labels.get("partition", ""),
            name=labels.get("name", ""), array_job_id=labels.get("array_job_id", ""),
            array_task_id=labels.get("array_task_id", ""),
            gpus=int(value("gpus", key) or 0),
            allocated_s=max(0.0, allocated.value - (value("allocated_base", key) or 0.0)),
            busy_s=max(0.0, (value("busy", key) or 0.0) - (value("busy_base", key) or 0.0)),
            idle_gpus=int(value("idle_gpus", key) or 0) + int(before.value if before else 0),
            gpu_memory_peak=value("gpu_memory_peak", key),
        )
        job.slowed_reason, job.slowed_s = slowed.get(key, ("", None))
        if job.allocated_s <= 0:
            continue  # lingered into the window after it ended: held nothing here
        if filters.account and job.account != filters.account:
            continue
        if filters.partition and job.partition != filters.partition:
            continue
        jobs.append(job)
    return jobs


def _top_reason(samples: list[Sample], cluster_label: str
                ) -> dict[tuple[str, str], tuple[str, float]]:
    """Per job, the slowing reason that took the most GPU-seconds, and those seconds."""
    top: dict[tuple[str, str], tuple[str, float]] = {}
    for s in samples:
        key = (s.labels.get(cluster_label, ""), s.labels.get("jobid", ""))
        if s.value > top.get(key, ("", 0.0))[1]:
            top[key] = (s.labels.get("reason", ""), s.value)
    return top


async def fetch_timelines(prom: PrometheusClient, window: Window, filters: Filters,
                          jobids: list[str]) -> dict[str, list[tuple[float, float]]]:
    """Busy ratio over time of a few jobs: one range query, whatever their number."""
    if not jobids:
        return {}
    step = max(1.0, window.seconds / TIMELINE_POINTS)
    rate_range = f"{max(round(step), 60)}s"
    sel = filters.matchers()
    ids = {"jobid": jobid_regex(jobids)}
    by = "jobid"
    query = (f"sum by ({by}) (increase({selector(BUSY, sel, ids)}[{rate_range}])) / "
             f"sum by ({by}) (increase({selector(ALLOCATED, sel, ids)}[{rate_range}]))")
    series = await prom.range(query, window.start, window.end, step)
    return {s.labels.get("jobid", ""): [(t, min(1.0, max(0.0, v))) for t, v in s.points]
            for s in series}


# --- job -----------------------------------------------------------------------------


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
        "info": with_node(f"last_over_time({s('slurm_job_info')}[{d}])", filters, d),
        "start": f"min_over_time({s('slurm_job_start_time_seconds')}[{d}])",
        "end": f"max_over_time({s('slurm_job_end_time_seconds')}[{d}])",
        "cpus": f"max_over_time({s('slurm_job_cpus')}[{d}])",
        "cpu": f"max_over_time({s(CPU)}[{d}])",
        "cpu_base": base(CPU),
        "memory_peak": f"max_over_time({s('slurm_job_memory_peak_bytes')}[{d}])",
        "memory_limit": f"max_over_time({s('slurm_job_memory_limit_bytes')}[{d}])",
        "allocated": f"max_over_time({s(ALLOCATED)}[{d}])",
        "allocated_base": base(ALLOCATED),
        "unknown": f"max_over_time({s(UNKNOWN)}[{d}])",
        "unknown_base": base(UNKNOWN),
        "busy": f"max_over_time({s(BUSY)}[{d}])",
        "busy_base": base(BUSY),
        "energy": f"max_over_time({s(ENERGY)}[{d}])",
        "energy_base": base(ENERGY),
        "cpu_energy": f"max_over_time({s(CPU_ENERGY)}[{d}])",
        "cpu_energy_base": base(CPU_ENERGY),
        "sm_active": f"max_over_time({s(SM_ACTIVE)}[{d}])",
        "sm_active_base": base(SM_ACTIVE),
        "tensor_active": f"max_over_time({s(TENSOR_ACTIVE)}[{d}])",
        "tensor_active_base": base(TENSOR_ACTIVE),
        "dram_active": f"max_over_time({s(DRAM_ACTIVE)}[{d}])",
        "dram_active_base": base(DRAM_ACTIVE),
        "gpu_memory_peak": f"max_over_time({s('slurm_job_gpu_memory_peak_bytes')}[{d}])",
        "gpu_memory_total": f"max by (instance, uuid) (last_over_time("
                            f"{selector('slurm_gpu_memory_total_bytes', equal)}[{d}])) "
                            f"and on (instance, uuid) last_over_time({s(ALLOCATED)}[{d}])",
        # throttled time by reason and GPU errors: one query (prometheus/gpu_events.py)
        "gpu_events": events_query(lambda m: f"max_over_time({s(m)}[{d}])"),
        "gpu_events_base": events_query(base, with_last=False),
    }


def _cpu_energy(now: dict[tuple[str, ...], float], before: dict[tuple[str, ...], float]
                ) -> dict[tuple[str, ...], float]:
    """CPU package and DRAM energy per (jobid, instance), summed over the domains."""
    total: dict[tuple[str, ...], float] = {}
    for key, value in now.items():
        total[key[:2]] = total.get(key[:2], 0.0) + max(0.0, value - before.get(key, 0.0))
    return total


def with_node(expr: str, filters: Filters, lookback: str) -> str:
    """``expr`` with each series' Slurm node joined in from its agent (``nodes.py``)."""
    cluster = {filters.cluster_label: filters.cluster} if filters.cluster else {}
    return join_node(expr, ("instance", filters.cluster_label),
                     selector(NODE_INFO, cluster), lookback)


async def fetch_jobs(prom: PrometheusClient, window: Window, jobids: list[str],
                     filters: Filters) -> dict[str, tuple[JobUsage, list[NodeDetail]]]:
    """The named jobs' usage and per-node detail; a job Prometheus does not know is absent."""
    queries = job_queries(window, jobids, filters)
    answers = await gather(*(prom.instant(q, window.end) for q in queries.values()))
    found = jobs_from_answers(dict(zip(queries, answers, strict=True)), filters)
    return {jobid: job for (_, jobid), job in found.items()}


def jobs_from_answers(got: dict[str, list[Sample]], filters: Filters
                      ) -> dict[tuple[str, str], tuple[JobUsage, list[NodeDetail]]]:
    """Jobs by (cluster, jobid) from the answers to ``job_queries`` (a ``*_base`` answer
    left out counts as 0: the window holds the whole job)."""

    def per(name: str, *labels: str) -> dict[tuple[str, ...], float]:
        return {tuple(s.labels.get(k, "") for k in labels): s.value for s in got.get(name, [])}

    node_keys = ("jobid", "instance")
    gpu_keys = ("jobid", "instance", "gpu", "uuid")
    start, end = per("start", *node_keys), per("end", *node_keys)
    cpus, cpu, cpu_base = per("cpus", *node_keys), per("cpu", *node_keys), per("cpu_base",
                                                                             *node_keys)
    mem_peak, mem_limit = per("memory_peak", *node_keys), per("memory_limit", *node_keys)
    alloc, alloc_base = per("allocated", *gpu_keys), per("allocated_base", *gpu_keys)
    busy, busy_base = per("busy", *gpu_keys), per("busy_base", *gpu_keys)
    unknown, unknown_base = per("unknown", *gpu_keys), per("unknown_base", *gpu_keys)
    energy, energy_base = per("energy", *gpu_keys), per("energy_base", *gpu_keys)
    cpu_energy = _cpu_energy(per("cpu_energy", *node_keys, "domain"),
                             per("cpu_energy_base", *node_keys, "domain"))
    sm, sm_base = per("sm_active", *gpu_keys), per("sm_active_base", *gpu_keys)
    activity = {name: (per(name, *gpu_keys), per(f"{name}_base", *gpu_keys))
                for name in ("tensor_active", "dram_active")}

    def active_s(name: str, gkey: tuple[str, ...]) -> float | None:
        now, before = activity[name]
        return max(0.0, now[gkey] - before.get(gkey, 0.0)) if gkey in now else None
    gpu_peak = per("gpu_memory_peak", *gpu_keys)
    events = gpu_events(got.get("gpu_events", []), got.get("gpu_events_base", []))
    gpu_total = per("gpu_memory_total", "instance", "uuid")

    found: dict[tuple[str, str], tuple[JobUsage, list[NodeDetail]]] = {}
    # The same job on the same target twice: its metadata changed (spool record found).
    # An info series that names the array task wins (see _by_job).
    infos = {(s.labels.get("jobid", ""), s.labels.get("instance", "")): s for s in
             sorted(got["info"], key=lambda s: bool(s.labels.get("array_job_id")))}
    gpus_of: dict[tuple[str, ...], list[tuple[str, ...]]] = {}  # (jobid, instance) -> GPUs
    for gkey in alloc:
        gpus_of.setdefault(gkey[:2], []).append(gkey)
    shown = shown_nodes(got["info"])
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
        node = NodeDetail(
            node=shown[instance], target=instance,
            cpus=int(cpus[key]) if key in cpus else None,
            cpu_s=cpu[key] - cpu_base.get(key, 0.0) if key in cpu else None,
            memory_peak=mem_peak.get(key), memory_limit=mem_limit.get(key),
            cpu_energy_j=cpu_energy.get(key),
        )
        for gkey in sorted(gpus_of.get(key, []), key=_gpu_order):
            gpu = GpuDetail(
                gpu=gkey[2], uuid=gkey[3],
                allocated_s=max(0.0, alloc[gkey] - alloc_base.get(gkey, 0.0)),
                busy_s=max(0.0, busy.get(gkey, 0.0) - busy_base.get(gkey, 0.0)),
                unknown_s=max(0.0, unknown[gkey] - unknown_base.get(gkey, 0.0))
                if gkey in unknown else None,
                memory_peak=gpu_peak.get(gkey),
                memory_total=gpu_total.get((instance, gkey[3])),
                energy_j=(energy[gkey] - energy_base.get(gkey, 0.0)) if gkey in energy else None,
                sm_active_s=max(0.0, sm[gkey] - sm_base.get(gkey, 0.0)) if gkey in sm else None,
                tensor_active_s=active_s("tensor_active", gkey),
                dram_active_s=active_s("dram_active", gkey),
            )
            gpu.throttled, gpu.faults = events.get(gkey, ([], []))
            node.gpus.append(gpu)
        nodes.append(node)
        _add_node(usage, node, start.get(key), end.get(key))
    return found


def _gpu_order(key: tuple[str, ...]) -> tuple[int, ...]:
    return tuple(int(p) if p.isdigit() else 0 for p in key[2].split("."))


def _add_node(usage: JobUsage, node: NodeDetail, start: float | None,
              end: float | None) -> None:
    usage.gpus += len(node.gpus)
    usage.allocated_s += sum(g.allocated_s for g in node.gpus)
    usage.busy_s += sum(g.busy_s for g in node.gpus)
    usage.unknown_s += sum(g.unknown_s or 0.0 for g in node.gpus)
    measured = [g for g in node.gpus if g.sm_active_s is not None]
    if measured:
        usage.sm_active_s = (usage.sm_active_s or 0.0) + sum(g.sm_active_s or 0.0
                                                             for g in measured)
        usage.gpm_allocated_s += sum(g.allocated_s for g in measured)
        for name in ("tensor_active_s", "dram_active_s"):
            known = [getattr(g, name) for g in measured if getattr(g, name) is not None]
            if known:
                setattr(usage, name, (getattr(usage, name) or 0.0) + sum(known))
    usage.idle_gpus += sum(1 for g in node.gpus if g.allocated_s > 0 and g.busy_s <= 0)
    peaks = [g.memory_peak for g in node.gpus if g.memory_peak is not None]
    if peaks:
        usage.gpu_memory_peak = max([*peaks, usage.gpu_memory_peak or 0.0])
    if start is not None:
        usage.start = start if usage.start is None else min(usage.start, start)
    if end is not None:
        usage.end = end if usage.end is None else max(usage.end, end)
