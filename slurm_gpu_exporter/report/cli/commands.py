"""What each ``slurm-gpu-report`` subcommand does with its parsed flags: ``job``,
``low-util`` (and its notices), ``archive``, ``usage`` and ``enforce``."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from slurm_gpu_exporter.report.cli.archive_open import archive_libraries
from slurm_gpu_exporter.report.cli.flags import munge_auth, prometheus
from slurm_gpu_exporter.report.cli.reports import (
    EXIT_UNKNOWN_JOB,
    job_report,
    low_util_report,
    not_yours_error,
    refuse_others_jobs,
    unknown_jobs_error,
)
from slurm_gpu_exporter.report.cli.review import deliver_review, review_plan, smtp_login
from slurm_gpu_exporter.report.enforce.decisions_text import decisions_json, decisions_table
from slurm_gpu_exporter.report.enforce.policy import load_policy
from slurm_gpu_exporter.report.enforce.run import EXIT_DOUBTFUL, EnforceOptions, run_enforce
from slurm_gpu_exporter.report.errors import ReportError
from slurm_gpu_exporter.report.figures.rules import Config, load_config
from slurm_gpu_exporter.report.figures.shapes import JobDetail, LowUtilReport
from slurm_gpu_exporter.report.figures.window import Window, make_window
from slurm_gpu_exporter.report.notify.notices import NotifyState, messages
from slurm_gpu_exporter.report.notify.relay import RelayLogin
from slurm_gpu_exporter.report.notify.run_login import login_for, sends_smtp
from slurm_gpu_exporter.report.notify.send import dry_run_text, send
from slurm_gpu_exporter.report.prometheus.archived import archived_jobs
from slurm_gpu_exporter.report.prometheus.array_tasks import resolve_array_tasks
from slurm_gpu_exporter.report.prometheus.queries import Filters
from slurm_gpu_exporter.report.render import html, text
from slurm_gpu_exporter.report.render.usage import render_usage
from slurm_gpu_exporter.report.render.values import when
from slurm_gpu_exporter.report.slurm.accounting import (
    sacct_accounting,
    sacct_window,
)

if TYPE_CHECKING:
    from slurm_gpu_exporter.report.archive.store import ArchiveStore

log = logging.getLogger("slurm_gpu_exporter.report")


async def run_enforce_command(args: argparse.Namespace, now: float) -> int:
    policy = load_policy(args.policy)
    if args.cancel and policy.warn_after_s and not args.notify:
        raise ReportError("enforce --cancel warns users first: give --notify smtp://host or "
                          "a webhook URL (or set idle.warn_after = [] in the policy)")
    options = EnforceOptions(
        policy=policy, cancel=args.cancel, state_path=Path(args.state_file),
        filters=Filters(cluster=args.cluster, cluster_label=args.cluster_label),
        notify=args.notify, mail_to=args.mail_to, mail_from=args.mail_from,
        node_label=args.node_label,
        # read before any query; a dry run (no --cancel) sends nothing
        login=login_for(args, policy.relay, sends_smtp(args.notify), not args.cancel))
    logging.getLogger("slurm_gpu_exporter.report.enforce").setLevel(logging.INFO)
    async with prometheus(args) as prom:
        run = await run_enforce(prom, options, now)
    dry_run = not args.cancel
    sys.stdout.write(decisions_json(run.decisions, dry_run, run.queries)
                     if args.format == "json" else decisions_table(run.decisions, dry_run))
    if run.exit_code == EXIT_DOUBTFUL:
        print("slurm-gpu-report: some jobs were skipped because their metrics cannot be "
              "trusted (see the reasons); check those agents and Prometheus",
              file=sys.stderr)
    return run.exit_code


@contextmanager
def _progress(what: str) -> Iterator[None]:
    """A spinner on the terminal while queries run; nothing when stderr is not a TTY."""
    if not sys.stderr.isatty():
        yield
        return
    from rich.console import Console

    with Console(stderr=True).status(what):
        yield


def _open_archive(args: argparse.Namespace, write: bool, what: str) -> ArchiveStore:
    """The archive at --db, imported only here: its libraries are the ``archive`` extra."""
    with archive_libraries(what):
        from slurm_gpu_exporter.report.archive.store import ArchiveStore

        return ArchiveStore(args.db, write=write, timeout_s=args.db_timeout)


def _write(args: argparse.Namespace, output: str) -> None:
    if args.output:
        try:
            Path(args.output).write_text(output)
        except OSError as exc:
            raise ReportError(f"cannot write {args.output}: {exc.strerror}") from None
    else:
        sys.stdout.write(output)


def _color() -> bool:
    return sys.stdout.isatty() and "NO_COLOR" not in os.environ


def render_low_util(report: LowUtilReport, fmt: str) -> str:
    renderers: dict[str, Callable[[LowUtilReport], str]] = {
        "table": lambda r: text.low_util_table(r, color=_color()),
        "csv": text.low_util_csv, "json": text.low_util_json,
        "markdown": text.low_util_markdown, "html": html.low_util_html,
    }
    return renderers[fmt](report)


def render_jobs(details: list[JobDetail], fmt: str, queries: int) -> str:
    renderers: dict[str, Callable[[list[JobDetail]], str]] = {
        "table": lambda d: text.job_table(d, color=_color()),
        "csv": text.job_csv, "json": lambda d: text.job_json(d, queries),
        "markdown": text.job_markdown, "html": html.job_html,
    }
    return renderers[fmt](details)


async def run_low_util(args: argparse.Namespace, config: Config, now: float) -> int:
    window = make_window(args.since, args.start, args.end, now)
    threshold = args.threshold if args.threshold is not None else config.threshold
    if not 0 < threshold <= 1:
        raise ReportError("bad --threshold: give a busy ratio between 0 and 1, e.g. 0.25")
    filters = Filters(user=args.user, account=args.account, partition=args.partition,
                      cluster=args.cluster, cluster_label=args.cluster_label)
    min_gpu_hours = (args.min_gpu_hours if args.min_gpu_hours is not None
                     else config.min_gpu_hours)
    review = review_plan(args, config.relay)  # before the queries: a bad address fails now
    login = review.login if review is not None else smtp_login(args, config.relay)
    chart_jobs = config.chart_jobs if args.format == "html" or review else 0
    store = _open_archive(args, False, "low-util --db") if args.db else None

    def archived(window: Window) -> list:  # type: ignore[type-arg]
        assert store is not None
        with store:
            return store.ended_usage(window, args.user, args.account, args.partition,
                                     args.cluster)

    async with prometheus(args) as prom:
        with _progress("querying Prometheus…"):
            report = await low_util_report(prom, window, filters, threshold, min_gpu_hours,
                                           chart_jobs, archived if store else None,
                                           config.slowed_share)
    log.info("%d PromQL queries for %d jobs", report.queries, report.jobs_seen)
    if store is not None:
        print(f"slurm-gpu-report: {report.jobs_seen - report.from_archive} jobs from "
              f"Prometheus, {report.from_archive} ended ones only in the archive "
              f"{store.where} (whole-life figures)", file=sys.stderr)
    if review is not None:
        return deliver_review(report, review, args.mail_from, args.cluster)
    if args.notify or args.dry_run:
        return _notify(args, report, config, now, login)
    _write(args, render_low_util(report, args.format))
    return 0


def _notify(args: argparse.Namespace, report: LowUtilReport, config: Config,
            now: float, login: RelayLogin) -> int:
    state = NotifyState(Path(args.state_file))
    todo = messages(report, config, state, now, args.mail_to)
    if not todo:
        print("Nothing to send: no flagged job that was not reported in the last "
              f"{config.repeat_after_days:g} days.")
        return 0
    if args.dry_run:
        for message, _ in todo:
            print(dry_run_text(message))
        print(f"(dry run: {len(todo)} messages not sent)")
        return 0
    keep_s = config.repeat_after_days * 86400
    for message, jobs in todo:
        send(message, args.notify, args.mail_from, login)
        state.mark(jobs, now, keep_s)  # after each send: a later failure loses nothing
        print(f"sent to {message.to}: {len(jobs)} jobs")
    return 0


async def run_job(args: argparse.Namespace, config: Config, now: float) -> int:
    if args.db:  # before the queries: a missing archive library is said at once
        with archive_libraries("job --db"):
            import slurm_gpu_exporter.report.archive.store  # noqa: F401
    window = make_window(args.since, args.start, args.end, now, default_since="30d")
    filters = Filters(cluster=args.cluster, cluster_label=args.cluster_label)

    def accounting(jobids: list[str]) -> dict:  # type: ignore[type-arg]
        return {} if args.no_sacct else sacct_accounting(jobids)

    async with prometheus(args) as prom:
        with _progress("querying Prometheus…"):
            # An array task asked as users know it (1234_5) is looked up by its own id.
            args.jobids = await resolve_array_tasks(prom, window, args.jobids, filters)
            details, unknown = await job_report(prom, window, list(dict.fromkeys(args.jobids)),
                                                filters, config, accounting, now)
        log.info("%d PromQL queries for %d jobs", prom.queries, len(args.jobids))
        queries = prom.queries
    if unknown and args.db:
        details, unknown = _from_archive(args, details, unknown)
    problem = None
    not_yours: list[str] = []
    if unknown:  # past retention: the archive behind slurm-gpu-proxy, if it has one
        async with prometheus(args) as prom:
            asked = await archived_jobs(prom, unknown, args.cluster)
        details = _with_archived(args, details, asked.found, f"through {asked.url}")
        unknown = [j for j in unknown if j not in asked.found and j not in asked.not_yours]
        not_yours, problem = list(asked.not_yours), asked.problem
    if details:
        _write(args, render_jobs(details, args.format, queries))
    if not_yours:
        raise not_yours_error(not_yours)
    if unknown:
        if munge_auth(args):
            refuse_others_jobs(unknown)
        if problem:
            raise ReportError(f"no metrics for job {', '.join(unknown)} in Prometheus in "
                              f"the window, and {problem}; try again, or widen --since",
                              EXIT_UNKNOWN_JOB)
        if args.db:
            raise ReportError(f"no metrics for job {', '.join(unknown)} in Prometheus in the "
                              "window, nor in the archive; check the id, or widen --since",
                              EXIT_UNKNOWN_JOB)
        raise unknown_jobs_error(unknown, window)
    return 0


def _from_archive(args: argparse.Namespace, details: list[JobDetail], unknown: list[str]
                  ) -> tuple[list[JobDetail], list[str]]:
    """The jobs Prometheus has no samples of, from the archive, in the order asked."""
    with _open_archive(args, False, "job --db") as store:
        archived = store.details(unknown, args.cluster)
    details = _with_archived(args, details, archived, store.where)
    return details, [j for j in unknown if j not in archived]


def _with_archived(args: argparse.Namespace, details: list[JobDetail],
                   archived: dict[str, list[tuple[JobDetail, float]]], where: str
                   ) -> list[JobDetail]:
    """``details`` and the archived jobs, in the order asked, each with a note that it
    comes from the archive (``where``: the database, or the proxy it came through)."""
    order = {jobid: i for i, jobid in enumerate(args.jobids)}
    for jobid in dict.fromkeys(args.jobids):  # an id asked twice is shown once
        for detail, archived_at in archived.get(jobid, []):
            # A note, so every format says it the way it says the rest of the job.
            detail.notes.insert(0, f"From the job archive ({where}, archived "
                                   f"{when(archived_at)}): Prometheus has no samples of this "
                                   "job in the window.")
            details.append(detail)
    details.sort(key=lambda d: order.get(d.usage.jobid, len(order)))
    return details


async def run_archive(args: argparse.Namespace, config: Config, now: float) -> int:
    window = make_window(args.since, args.start, args.end, now, default_since="2h")
    filters = Filters(cluster=args.cluster, cluster_label=args.cluster_label)

    def accounting(window: Window) -> dict:  # type: ignore[type-arg]
        return {} if args.no_sacct else sacct_window(window.start, window.end)

    with archive_libraries("archive"):
        from slurm_gpu_exporter.report.archive.collect import archive
    with _open_archive(args, True, "archive") as store:
        async with prometheus(args) as prom:
            with _progress("querying Prometheus…"):
                run = await archive(prom, store, window, filters, config, accounting, now)
    print(f"archived {run.stored} jobs that ended by {when(window.end)} into {store.where} "
          f"({run.batches} batches, {run.queries} PromQL queries)")
    return 0


def run_usage(args: argparse.Namespace) -> int:
    with archive_libraries("usage"):
        from slurm_gpu_exporter.report.archive.usage import month_window, usage_report
    now = time.time()
    if args.month and (args.since or args.start or args.end):
        raise ReportError("give either --month or --since/--start/--end, not both")
    window = (month_window(args.month, now) if args.month
              else make_window(args.since, args.start, args.end, now, default_since="30d"))
    factor = load_config(args.config).emissions_gco2e_per_kwh
    with _open_archive(args, False, "usage") as store:
        report = usage_report(store, window, args.by, args.cluster)
    report.gco2e_per_kwh = factor
    _write(args, render_usage(report, args.format, color=_color()))
    return 0
