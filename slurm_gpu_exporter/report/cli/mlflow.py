"""``slurm-gpu-report mlflow``: the figures of the jobs that ended in the window, written
once into the MLflow runs their agents named (report/mlflow/ says which runs, and how).

The figures are ``job``'s (the same ``job_report``, over the same default window of
30 days up to now), so a run shows what ``slurm-gpu-report job JOBID`` says of its job;
``--since``/``--start``/``--end`` only choose which ended jobs are written now.

Exit status: 0 when every run was written, refused, expired or left pending as it
should be, and also where a run vanished or was deleted before its write (its user's
doing; said on stderr); ``EXIT_NOT_PERMITTED`` (11) when MLflow forbade (403) a write
into a run: the writer's MLflow user lacks a permission the site should grant (the
other runs are written all the same); 3 when the tracking server cannot be used at all.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections import Counter

from slurm_gpu_exporter.report.cli.flags import prometheus
from slurm_gpu_exporter.report.cli.reports import job_report
from slurm_gpu_exporter.report.errors import ReportError
from slurm_gpu_exporter.report.figures.rules import Config
from slurm_gpu_exporter.report.figures.shapes import Accounting, JobDetail
from slurm_gpu_exporter.report.figures.window import make_window, parse_duration
from slurm_gpu_exporter.report.inert_text import plain
from slurm_gpu_exporter.report.mlflow.figures import run_metrics, run_tags
from slurm_gpu_exporter.report.mlflow.named import named_runs, run_info_query
from slurm_gpu_exporter.report.mlflow.runs import (
    EXPIRED,
    PENDING_FILTER,
    REFUSED,
    TAG_EXPIRED_WHY,
    TAG_FIGURES,
    TAG_REFUSED_WHY,
    WRITTEN,
    PendingRun,
    Verdict,
    for_cluster,
    pending_run,
    trusted_jobs,
    verdict,
)
from slurm_gpu_exporter.report.mlflow.tracking import RunNotWritable, TrackingServer
from slurm_gpu_exporter.report.prometheus.queries import Filters
from slurm_gpu_exporter.report.slurm.accounting import sacct_accounting

log = logging.getLogger("slurm_gpu_exporter.report")

JOBS_PER_BATCH = 500  # job ids per query: the regex stays a size Prometheus takes
EXIT_NOT_PERMITTED = 11
_WHAT = {"write": "wrote the job's figures into", "refuse": "refused",
         "expire": "expired"}
_WOULD = {"write": "would write the job's figures into", "refuse": "would refuse",
          "expire": "would expire"}


async def run_mlflow(args: argparse.Namespace, config: Config, now: float) -> int:
    if not args.tracking_uri:
        raise ReportError("mlflow needs the tracking server: give --tracking-uri URL or set "
                          "MLFLOW_TRACKING_URI")
    chosen = make_window(args.since, args.start, args.end, now, default_since="2h")
    figures_window = make_window(None, None, None, now, default_since="30d")  # as `job`
    expiry_s = parse_duration(args.pending_expiry)
    filters = Filters(cluster=args.cluster, cluster_label=args.cluster_label)

    def accounting(jobids: list[str]) -> dict[str, Accounting]:
        return {} if args.no_sacct else sacct_accounting(jobids)

    done: Counter[str] = Counter()
    async with TrackingServer(args.tracking_uri, args.mlflow_timeout) as tracking:
        found = await tracking.search_runs(await tracking.experiment_ids(), PENDING_FILTER)
        runs = [r for r in map(pending_run, found) if r and for_cluster(r, args.cluster)]
        details: dict[str, JobDetail] = {}
        async with prometheus(args) as prom:
            # One query names every run of every job; only those jobs are looked up.
            named = named_runs(await prom.instant(
                run_info_query(figures_window.range, filters), now))
            jobids = trusted_jobs(runs, named)
            for at in range(0, len(jobids), JOBS_PER_BATCH):
                batch = jobids[at:at + JOBS_PER_BATCH]
                got, _ = await job_report(prom, figures_window, batch, filters, config,
                                          accounting, now)
                details.update((d.usage.jobid, d) for d in got)
            queries = prom.queries
        for run in runs:
            said = verdict(run, named, details.get(run.job_id), chosen, now, expiry_s)
            done[await _act(tracking, run, said, details, args.dry_run)] += 1
    print(f"{'dry run: ' if args.dry_run else ''}{done['write']} runs given their job's "
          f"figures, {done['refuse']} refused (not the run of the job it names), "
          f"{done['expire']} expired, {done['wait']} left pending, "
          f"{done['gone'] + done['forbidden']} not writable ({done['forbidden']} forbidden); "
          f"{len(runs)} pending runs looked at, {queries} PromQL queries, "
          f"{tracking.requests} MLflow requests")
    if done["forbidden"]:
        print(f"slurm-gpu-report: MLflow forbade writes into {done['forbidden']} runs: grant "
              "the writer's MLflow user EDIT on their experiments", file=sys.stderr)
        return EXIT_NOT_PERMITTED
    return 0


async def _act(tracking: TrackingServer, run: PendingRun, said: Verdict,
               details: dict[str, JobDetail], dry_run: bool) -> str:
    """Do what ``said`` says to ``run``; what happened (the verdict's action, or ``gone``
    / ``forbidden`` where MLflow would not take the write: that run alone is skipped)."""
    if said.action == "wait":
        log.info("run %s: %s; left pending", run.run_id, said.why)
        return "wait"
    print(f"{(_WOULD if dry_run else _WHAT)[said.action]} run {run.run_id} "
          f"(experiment {run.experiment_id}): {plain(said.why)}")
    if dry_run:
        return said.action
    try:
        if said.action == "refuse":
            await tracking.log_batch(run.run_id, {}, {TAG_FIGURES: REFUSED,
                                                      TAG_REFUSED_WHY: said.why}, 0)
        elif said.action == "expire":
            await tracking.log_batch(run.run_id, {}, {TAG_FIGURES: EXPIRED,
                                                      TAG_EXPIRED_WHY: said.why}, 0)
        else:
            await _write(tracking, run, details[run.job_id])
    except RunNotWritable as exc:
        log.warning("run %s (experiment %s) skipped: %s", run.run_id, run.experiment_id,
                    exc)
        return "forbidden" if exc.forbidden else "gone"
    return said.action


async def _write(tracking: TrackingServer, run: PendingRun, detail: JobDetail) -> None:
    """The figures and the marker in one request: a run has both or neither."""
    stamp_ms = int((detail.end or detail.now) * 1000)
    await tracking.log_batch(run.run_id, run_metrics(detail),
                             {**run_tags(detail), TAG_FIGURES: WRITTEN}, stamp_ms)
