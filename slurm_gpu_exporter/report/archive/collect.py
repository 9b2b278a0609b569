"""``slurm-gpu-report archive``: the jobs that ended in a window, summarized into the archive.

A job is archived once the agent's series of it carry its end time on every node it
ran on (``slurm_job_end_time_seconds``): the agent stops counting a job when it ends,
so every sample from then on holds the job's final counters. Those counters start
at 0 with the job, so their largest value in the window is the job's total, whatever
part of its life the window covers: the summary needs no baseline.

A fixed number of instant queries for any number of jobs (``len(archive_queries())``),
one ``sacct`` call for the window, and one transaction per batch of jobs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from slurm_gpu_exporter.report.archive.rows import ArchiveRecord
from slurm_gpu_exporter.report.archive.store import ArchiveStore
from slurm_gpu_exporter.report.figures.rules import Config, job_facts, notes_for
from slurm_gpu_exporter.report.figures.shapes import Accounting, JobDetail
from slurm_gpu_exporter.report.figures.table import archived
from slurm_gpu_exporter.report.figures.window import Window
from slurm_gpu_exporter.report.prometheus.client import PrometheusClient, gather
from slurm_gpu_exporter.report.prometheus.emissions import apply_series_factor
from slurm_gpu_exporter.report.prometheus.figure_promql import figure_queries
from slurm_gpu_exporter.report.prometheus.gpu_events import events_query
from slurm_gpu_exporter.report.prometheus.job_figures import INFO, jobs_from_answers
from slurm_gpu_exporter.report.prometheus.queries import Filters, selector, with_node

BATCH_JOBS = 500

WindowAccounting = Callable[[Window], dict[str, Accounting]]


@dataclass
class ArchiveRun:
    """What one ``archive`` run did."""

    ended: int = 0  # jobs that ended (on all their nodes) with samples in the window
    stored: int = 0
    batches: int = 0
    queries: int = 0


def archive_queries(window: Window, filters: Filters) -> dict[str, str]:
    """The instant queries of ``archive``, by the names ``jobs_from_answers`` reads."""
    equal = filters.matchers()
    d = window.range

    def s(metric: str) -> str:
        return selector(metric, equal)

    return {
        "info": with_node(f"last_over_time({s(INFO)}[{d}])", filters, d),
        # the figures the archive keeps (figures/table.py), without baselines
        **figure_queries(archived(), s, d, s, held=False, baselines=False),
        "gpu_info": f"max by (instance, uuid, name) (last_over_time({s('slurm_gpu_info')}"
                    f"[{d}]))",
        # version 5 on: throttled time by reason and GPU errors, one query
        "gpu_events": events_query(lambda m: f"max_over_time({s(m)}[{d}])"),
    }


def _ended_everywhere(got: dict, cluster_label: str) -> set[tuple[str, str]]:  # type: ignore[type-arg]
    """(cluster, jobid) of the jobs whose every target has sampled their end."""
    ran: dict[tuple[str, str], set[str]] = {}
    for sample in got["info"]:
        key = (sample.labels.get(cluster_label, ""), sample.labels.get("jobid", ""))
        ran.setdefault(key, set()).add(sample.labels.get("instance", ""))
    ended: dict[tuple[str, str], set[str]] = {}
    for sample in got["end"]:
        key = (sample.labels.get(cluster_label, ""), sample.labels.get("jobid", ""))
        ended.setdefault(key, set()).add(sample.labels.get("instance", ""))
    return {key for key, targets in ran.items() if targets <= ended.get(key, set())}


async def collect(prom: PrometheusClient, window: Window, filters: Filters, config: Config,
                  accounting: WindowAccounting) -> list[ArchiveRecord]:
    """The ended jobs' summaries: one instant query per name of ``archive_queries``."""
    queries = archive_queries(window, filters)
    answers = await gather(*(prom.instant(q, window.end) for q in queries.values()))
    got = dict(zip(queries, answers, strict=True))
    ended = _ended_everywhere(got, filters.cluster_label)
    if not ended:
        return []
    found = jobs_from_answers(got, filters)
    models = {(s.labels.get("instance", ""), s.labels.get("uuid", "")): s.labels.get("name", "")
              for s in got["gpu_info"]}
    acct = accounting(window)
    records = []
    for key in sorted(ended):
        if key not in found:
            continue
        usage, nodes = found[key]
        detail = JobDetail(usage=usage, nodes=nodes, accounting=acct.get(usage.jobid),
                           now=window.end, gco2e_per_kwh=config.emissions_gco2e_per_kwh)
        if detail.accounting and detail.accounting.state in ("RUNNING", "PENDING",
                                                             "SUSPENDED", "REQUEUED"):
            # slurmdbd has not heard of the end yet: the next (overlapping) run adds it.
            detail.accounting = None
        detail.notes = notes_for(job_facts(detail, config), config.notes)
        gpu_models = {}
        for node in nodes:
            instance = node.target
            for gpu in node.gpus:
                gpu_models[node.node, gpu.gpu] = models.get((instance, gpu.uuid), "")
        records.append(ArchiveRecord(detail, gpu_models))
    if config.emissions_series and records:
        # The factor over the window, weighted by each job's energy in it: the
        # emissions stored are those of the series, as `job` shows them.
        await apply_series_factor(prom, window, [r.detail for r in records], filters, config)
    return records


async def archive(prom: PrometheusClient, store: ArchiveStore, window: Window,
                  filters: Filters, config: Config, accounting: WindowAccounting,
                  archived_at: float, batch_jobs: int = BATCH_JOBS) -> ArchiveRun:
    """Summarize the jobs that ended in the window and upsert them, batch by batch."""
    records = await collect(prom, window, filters, config, accounting)
    run = ArchiveRun(ended=len(records), queries=prom.queries)
    for i in range(0, len(records), batch_jobs):
        batch = records[i:i + batch_jobs]
        store.store(batch, archived_at)
        run.stored += len(batch)
        run.batches += 1
    return run
