"""The two reports, assembled from the queries: ``low-util`` and ``job``."""

from __future__ import annotations

import os
import pwd
from collections.abc import Callable

from slurm_gpu_exporter.report.errors import ReportError
from slurm_gpu_exporter.report.figures.rules import Config, job_facts, low_util_note, notes_for
from slurm_gpu_exporter.report.figures.shapes import Accounting, JobDetail, JobUsage, LowUtilReport
from slurm_gpu_exporter.report.figures.window import Window
from slurm_gpu_exporter.report.prometheus.client import PrometheusClient
from slurm_gpu_exporter.report.prometheus.emissions import apply_series_factor
from slurm_gpu_exporter.report.prometheus.job_figures import fetch_jobs
from slurm_gpu_exporter.report.prometheus.queries import Filters, fetch_timelines, fetch_usage
from slurm_gpu_exporter.report.slurm.accounting import sacct_owners

EXIT_UNKNOWN_JOB = 5
EXIT_NOT_YOURS = 10  # job, top: another user's job, asked for with --auth munge

AccountingSource = Callable[[list[str]], dict[str, Accounting]]
ArchivedJobs = Callable[[Window], list[JobUsage]]


async def low_util_report(prom: PrometheusClient, window: Window, filters: Filters,
                          threshold: float, min_gpu_hours: float, chart_jobs: int = 0,
                          archived: ArchivedJobs | None = None, slowed_share: float = 0.2
                          ) -> LowUtilReport:
    """Jobs under ``threshold`` busy, most wasteful first; ``chart_jobs`` of them get a
    timeline (one range query for all of them). ``archived`` adds the jobs that ended in
    the window and that Prometheus has no samples of (past its retention). A flagged job
    that a slowing reason held back ``slowed_share`` of its busy time gets a note."""
    jobs = await fetch_usage(prom, window, filters)
    from_archive = 0
    if archived is not None:
        seen = {(j.cluster, j.jobid) for j in jobs}
        extra = [j for j in archived(window) if (j.cluster, j.jobid) not in seen]
        from_archive = len(extra)
        jobs.extend(extra)
    ratios = [j.busy_ratio for j in jobs if j.busy_ratio is not None]
    flagged = [j for j in jobs
               if j.busy_ratio is not None and j.busy_ratio < threshold
               and j.gpu_hours >= min_gpu_hours]
    flagged.sort(key=lambda j: (-j.wasted_gpu_hours, j.cluster, j.jobid))
    report = LowUtilReport(window=window, threshold=threshold, jobs_seen=len(jobs),
                           flagged=flagged, all_ratios=ratios, from_archive=from_archive)
    for job in flagged:
        note = low_util_note(job, slowed_share)
        if note is not None:
            report.notes[job.jobid] = note
    if chart_jobs > 0 and flagged:
        report.timelines = await fetch_timelines(
            prom, window, filters, [j.jobid for j in flagged[:chart_jobs]])
    report.queries = prom.queries
    return report


async def job_report(prom: PrometheusClient, window: Window, jobids: list[str],
                     filters: Filters, config: Config, accounting: AccountingSource,
                     now: float) -> tuple[list[JobDetail], list[str]]:
    """The named jobs' details with their notes, and the ids Prometheus does not know."""
    found = await fetch_jobs(prom, window, jobids, filters)
    acct = accounting([j for j in jobids if j in found]) if found else {}
    details = []
    for jobid in jobids:
        if jobid not in found:
            continue
        usage, nodes = found[jobid]
        details.append(JobDetail(usage=usage, nodes=nodes, accounting=acct.get(jobid),
                                 now=now, gco2e_per_kwh=config.emissions_gco2e_per_kwh))
    said: dict[str, str] = {}
    if config.emissions_series and details:
        said = await apply_series_factor(prom, window, details, filters, config)
    for detail in details:
        detail.notes = notes_for(job_facts(detail, config), config.notes)
        if detail.usage.jobid in said:
            detail.notes.append(said[detail.usage.jobid])
    unknown = [j for j in jobids if j not in found]
    return details, unknown


def unknown_jobs_error(unknown: list[str], window: Window) -> ReportError:
    ids = ", ".join(unknown)
    return ReportError(f"no metrics for job {ids} in Prometheus in the window; check the id, "
                       "or widen it with --since", EXIT_UNKNOWN_JOB)


def not_yours_error(jobids: list[str]) -> ReportError:
    """Another user's jobs, asked for by a user signed in as themself."""
    me = pwd.getpwuid(os.getuid()).pw_name
    return ReportError(f"job {', '.join(jobids)} is not yours ({me}): the proxy shows each "
                       "user only their own jobs; ask the job's owner or an admin",
                       EXIT_NOT_YOURS)


def refuse_others_jobs(unknown: list[str]) -> None:
    """Signed in as oneself (munge), the proxy answers another user's job as unknown:
    say it is theirs (sacct knows its owner), not unknown."""
    me = pwd.getpwuid(os.getuid()).pw_name
    others = [j for j, user in sacct_owners(unknown).items() if user != me]
    if others:
        raise not_yours_error(others)
