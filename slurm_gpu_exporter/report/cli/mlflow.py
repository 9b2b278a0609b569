"""``slurm-gpu-report mlflow``: the figures of the jobs that ended in the window, written
once into the MLflow runs that name them (report/mlflow/ says which runs, and how).

The figures are ``job``'s (the same ``job_report``, over the same default window of
30 days up to now), so a run shows what ``slurm-gpu-report job JOBID`` says of its job;
``--since``/``--start``/``--end`` only choose which ended jobs are written now."""

from __future__ import annotations

import argparse
import logging
from collections import Counter

from slurm_gpu_exporter.report.cli.flags import prometheus
from slurm_gpu_exporter.report.cli.reports import job_report
from slurm_gpu_exporter.report.errors import ReportError
from slurm_gpu_exporter.report.figures.rules import Config
from slurm_gpu_exporter.report.figures.shapes import Accounting, JobDetail
from slurm_gpu_exporter.report.figures.window import make_window
from slurm_gpu_exporter.report.inert_text import plain
from slurm_gpu_exporter.report.mlflow.figures import run_metrics, run_tags
from slurm_gpu_exporter.report.mlflow.runs import (
    PENDING_FILTER,
    REFUSED,
    TAG_FIGURES,
    TAG_REFUSED_WHY,
    WRITTEN,
    PendingRun,
    for_cluster,
    pending_run,
    verdict,
)
from slurm_gpu_exporter.report.mlflow.tracking import TrackingServer
from slurm_gpu_exporter.report.prometheus.queries import Filters
from slurm_gpu_exporter.report.slurm.accounting import sacct_accounting

log = logging.getLogger("slurm_gpu_exporter.report")

JOBS_PER_BATCH = 500  # job ids per query: the regex stays a size Prometheus takes


async def run_mlflow(args: argparse.Namespace, config: Config, now: float) -> int:
    if not args.tracking_uri:
        raise ReportError("mlflow needs the tracking server: give --tracking-uri URL or set "
                          "MLFLOW_TRACKING_URI")
    chosen = make_window(args.since, args.start, args.end, now, default_since="2h")
    figures_window = make_window(None, None, None, now, default_since="30d")  # as `job`
    filters = Filters(cluster=args.cluster, cluster_label=args.cluster_label)

    def accounting(jobids: list[str]) -> dict[str, Accounting]:
        return {} if args.no_sacct else sacct_accounting(jobids)

    done: Counter[str] = Counter()
    async with TrackingServer(args.tracking_uri, args.mlflow_timeout) as tracking:
        found = await tracking.search_runs(await tracking.experiment_ids(), PENDING_FILTER)
        runs = [r for r in map(pending_run, found) if r and for_cluster(r, args.cluster)]
        jobids = sorted({r.job_id for r in runs})
        details: dict[str, JobDetail] = {}
        async with prometheus(args) as prom:
            for at in range(0, len(jobids), JOBS_PER_BATCH):
                batch = jobids[at:at + JOBS_PER_BATCH]
                got, _ = await job_report(prom, figures_window, batch, filters, config,
                                          accounting, now)
                details.update((d.usage.jobid, d) for d in got)
            queries = prom.queries
        for run in runs:
            detail = details.get(run.job_id)
            said = verdict(run, detail, chosen)
            done[said.action] += 1
            if said.action == "wait":
                log.info("run %s: %s; left pending", run.run_id, said.why)
                continue
            print(f"{_what(said.action, args.dry_run)} run {run.run_id} "
                  f"(experiment {run.experiment_id}): {plain(said.why)}")
            if args.dry_run:
                continue
            if said.action == "refuse":
                await tracking.log_batch(run.run_id, {}, {TAG_FIGURES: REFUSED,
                                                          TAG_REFUSED_WHY: said.why}, 0)
            else:
                assert detail is not None
                await _write(tracking, run, detail)
    print(f"{'dry run: ' if args.dry_run else ''}{done['write']} runs given their job's "
          f"figures, {done['refuse']} refused (another user's job), {done['wait']} left "
          f"pending; {len(runs)} pending runs looked at, {queries} PromQL queries, "
          f"{tracking.requests} MLflow requests")
    return 0


def _what(action: str, dry_run: bool) -> str:
    if dry_run:
        return {"write": "would write the job's figures into", "refuse": "would refuse"}[action]
    return {"write": "wrote the job's figures into", "refuse": "refused"}[action]


async def _write(tracking: TrackingServer, run: PendingRun, detail: JobDetail) -> None:
    """The figures and the marker in one request: a run has both or neither."""
    stamp_ms = int((detail.end or detail.now) * 1000)
    await tracking.log_batch(run.run_id, run_metrics(detail),
                             {**run_tags(detail), TAG_FIGURES: WRITTEN}, stamp_ms)
