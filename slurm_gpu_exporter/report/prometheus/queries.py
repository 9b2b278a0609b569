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
from slurm_gpu_exporter.report.figures.shapes import JobUsage
from slurm_gpu_exporter.report.figures.table import figure, set_value
from slurm_gpu_exporter.report.figures.window import Window
from slurm_gpu_exporter.report.prometheus.client import PrometheusClient, Sample, gather
from slurm_gpu_exporter.report.prometheus.figure_promql import BASELINE_LOOKBACK, per_job_queries
from slurm_gpu_exporter.report.prometheus.gpu_events import THROTTLED
from slurm_gpu_exporter.report.prometheus.nodes import NODE_INFO, join_node

# The agent's series of the figures other queries read too (figures/table.py names them).
ALLOCATED = figure("allocated").metric
BUSY = figure("busy").metric
ENERGY = figure("energy").metric
CPU_ENERGY = figure("cpu_energy").metric  # by domain: package, dram
SM_ACTIVE = figure("sm_active").metric
CPU = figure("cpu").metric
TIMELINE_POINTS = 120
# The job figures low-util asks, summed by job (figures/table.py): what GPUs it held, how
# busy they were, their memory peak. Asked in two groups to keep the queries' order.
LOW_UTIL_HELD = ("allocated", "busy")
LOW_UTIL_PEAKS = ("gpu_memory_peak",)

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
        **per_job_queries(LOW_UTIL_HELD, s, d, by),
        # GPUs never busy since their job started in the window. A job that started
        # before also has GPUs whose counter stood still in the window; those are
        # counted by idle_before_query, over those jobs alone.
        "idle_gpus": f"count by ({by}) (max_over_time({s(BUSY)}[{d}]) == 0)",
        **per_job_queries(LOW_UTIL_PEAKS, s, d, by),
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
            idle_gpus=int(value("idle_gpus", key) or 0) + int(before.value if before else 0),
        )
        for name in (*LOW_UTIL_HELD, *LOW_UTIL_PEAKS):  # a counter less its baseline
            fig, now = figure(name), value(name, key)
            if fig.shape == "counter":
                now = max(0.0, (now or 0.0) - (value(f"{name}_base", key) or 0.0))
            if now is not None:
                set_value(job, fig.job_attr, now)
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


# --- job (the job figures' queries: job_figures.py) ----------------------------------


def with_node(expr: str, filters: Filters, lookback: str) -> str:
    """``expr`` with each series' Slurm node joined in from its agent (``nodes.py``)."""
    cluster = {filters.cluster_label: filters.cluster} if filters.cluster else {}
    return join_node(expr, ("instance", filters.cluster_label),
                     selector(NODE_INFO, cluster), lookback)
