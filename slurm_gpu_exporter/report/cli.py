"""``slurm-gpu-report``: ``job JOBID…`` and ``low-util`` from Prometheus; ``archive`` into
the job archive, and ``usage`` from it; ``enforce`` (warn, then cancel, idle GPU jobs)
and ``remediate`` (drain nodes on GPU faults).

Every failure is one line on stderr and a non-zero exit status; an empty result
says so and exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from slurm_gpu_exporter.report.accounting import sacct_accounting, sacct_window
from slurm_gpu_exporter.report.archive import archive
from slurm_gpu_exporter.report.archive_store import DEFAULT_DB, ArchiveStore
from slurm_gpu_exporter.report.defaults import DEFAULT_CONFIG
from slurm_gpu_exporter.report.enforce import EXIT_DOUBTFUL, EnforceOptions, run_enforce
from slurm_gpu_exporter.report.errors import ReportError
from slurm_gpu_exporter.report.model import JobDetail, LowUtilReport
from slurm_gpu_exporter.report.notify import (
    EXIT_NOTIFY,
    NotifyState,
    dry_run_text,
    messages,
    send,
)
from slurm_gpu_exporter.report.policy import DEFAULT_POLICY, load_policy
from slurm_gpu_exporter.report.promql import Connection, PrometheusClient, read_secret
from slurm_gpu_exporter.report.queries import Filters
from slurm_gpu_exporter.report.remediate_cli import add_remediate_command, run_remediate
from slurm_gpu_exporter.report.render import html, text
from slurm_gpu_exporter.report.render.decisions_text import decisions_json, decisions_table
from slurm_gpu_exporter.report.render.usage import render_usage
from slurm_gpu_exporter.report.render.values import when
from slurm_gpu_exporter.report.reports import (
    EXIT_UNKNOWN_JOB,
    job_report,
    low_util_report,
    unknown_jobs_error,
)
from slurm_gpu_exporter.report.rules import Config, load_config
from slurm_gpu_exporter.report.usage import month_window, usage_report
from slurm_gpu_exporter.report.window import Window, make_window

log = logging.getLogger("slurm_gpu_exporter.report")

FORMATS = ("table", "csv", "json", "markdown", "html")
DEFAULT_URL = "http://localhost:9090"
DEFAULT_STATE = "/var/lib/slurm-gpu-report/notified.json"
DEFAULT_ENFORCE_STATE = "/var/lib/slurm-gpu-report/enforce.json"


def _prometheus_options(parser: argparse.ArgumentParser) -> None:
    conn = parser.add_argument_group("Prometheus")
    conn.add_argument("--prometheus-url",
                      default=os.environ.get("SLURM_GPU_REPORT_PROMETHEUS_URL", DEFAULT_URL),
                      help="base URL of the Prometheus API (env SLURM_GPU_REPORT_PROMETHEUS_URL;"
                           f" default {DEFAULT_URL})")
    conn.add_argument("--timeout", type=float, default=30.0, help="seconds per query")
    conn.add_argument("--username", help="basic auth user")
    conn.add_argument("--password-file", help="basic auth password, first line of this file")
    conn.add_argument("--bearer-token-file", help="bearer token, first line of this file")
    conn.add_argument("--ca-file", help="CA bundle to verify Prometheus' TLS certificate")
    conn.add_argument("--cert-file", help="client certificate (TLS)")
    conn.add_argument("--key-file", help="client certificate key (TLS)")
    conn.add_argument("--insecure-skip-verify", action="store_true",
                      help="do not verify Prometheus' TLS certificate")


def _db(parser: argparse.ArgumentParser, default: str | None) -> None:
    store = parser.add_argument_group("job archive")
    env = os.environ.get("SLURM_GPU_REPORT_DB")
    if default is None:
        store.add_argument("--db", metavar="URL",
                           help="also read the job archive: sqlite:///PATH or postgresql://…")
    else:
        store.add_argument("--db", metavar="URL", default=env or default,
                           help="the job archive: sqlite:///PATH or postgresql://… (env "
                                f"SLURM_GPU_REPORT_DB; default {default})")
    store.add_argument("--db-timeout", type=float, default=10.0, metavar="SECONDS",
                       help="how long to wait for the archive (connection, locks)")


def _window_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--since", help="window length up to --end (e.g. 7d, 36h)")
    parser.add_argument("--start", help="window start (ISO 8601 or Unix time)")
    parser.add_argument("--end", help="window end (ISO 8601, Unix time or 'now')")


def _output_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--format", choices=FORMATS, default="table")
    parser.add_argument("--output", "-o", help="write the report to this file, not stdout")


def _common(parser: argparse.ArgumentParser, outputs: bool = True) -> None:
    _prometheus_options(parser)
    if outputs:
        _output_options(parser)
    parser.add_argument("--config", help="TOML file with thresholds, notes and templates")
    parser.add_argument("--cluster", help="only series whose cluster label has this value")
    parser.add_argument("--cluster-label", default="cluster",
                        help="the label the scrape config puts the cluster name in")
    _window_options(parser)
    parser.add_argument("--verbose", "-v", action="store_true",
                        help="log each query and the query count on stderr")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="slurm-gpu-report",
        description="GPU efficiency reports of Slurm jobs from the metrics of "
                    "slurm-gpu-exporter in Prometheus.")
    sub = parser.add_subparsers(dest="command", required=True)
    job = sub.add_parser("job", help="one or more jobs: usage per node and GPU, and notes")
    job.add_argument("jobids", nargs="+", metavar="JOBID")
    job.add_argument("--no-sacct", action="store_true",
                     help="do not ask Slurm accounting for time limit and memory request")
    _common(job)
    _db(job, None)
    low = sub.add_parser("low-util", help="jobs under a GPU busy threshold in a window")
    low.add_argument("--threshold", type=float,
                     help="busy ratio under which a job is flagged (0..1; default from config)")
    low.add_argument("--user")
    low.add_argument("--account")
    low.add_argument("--partition")
    low.add_argument("--min-gpu-hours", type=float,
                     help="flag only jobs that held at least this many GPU-hours")
    low.add_argument("--notify", metavar="TARGET",
                     help="tell each flagged user: smtp://host[:port] or a webhook URL")
    low.add_argument("--dry-run", action="store_true", help="print what --notify would send")
    low.add_argument("--mail-to", default="{user}",
                     help="recipient template, e.g. '{user}@example.org' (default '{user}')")
    low.add_argument("--mail-from", default="slurm-gpu-report", help="sender address")
    low.add_argument("--state-file", default=DEFAULT_STATE,
                     help=f"when each job was reported (default {DEFAULT_STATE})")
    _common(low)
    _db(low, None)
    arch = sub.add_parser("archive", help="store a summary of the jobs that ended in a window "
                                          "in the job archive (default --since 2h)")
    arch.add_argument("--no-sacct", action="store_true",
                      help="do not ask Slurm accounting for state, exit code and limits")
    _common(arch, outputs=False)
    _db(arch, DEFAULT_DB)
    use = sub.add_parser("usage", help="GPU-hours held, busy and wasted per account, user, "
                                       "partition or cluster, from the job archive")
    use.add_argument("--by", nargs="+", required=True, metavar="KEY",
                     help="one or more of account, user, partition, cluster")
    use.add_argument("--month", metavar="YYYY-MM", help="the jobs that ended in this month")
    use.add_argument("--cluster", help="only jobs of this cluster")
    _window_options(use)
    _output_options(use)
    _db(use, DEFAULT_DB)
    sub.add_parser("default-config", help="print the default configuration (TOML)")
    _add_enforce_commands(sub)
    return parser


def _add_enforce_commands(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """``enforce``, ``default-policy`` and ``remediate``."""
    enforce = sub.add_parser(
        "enforce", help="warn, then cancel, jobs whose GPUs are idle (dry run by default)")
    enforce.add_argument("--policy", required=True, metavar="FILE",
                         help="the policy (TOML; see default-policy)")
    enforce.add_argument("--cancel", action="store_true",
                         help="act: send the warnings and cancel (without it: a dry run)")
    enforce.add_argument("--format", choices=("table", "json"), default="table")
    enforce.add_argument("--notify", metavar="TARGET",
                         help="warn users through smtp://host[:port] or a webhook URL")
    enforce.add_argument("--mail-to", default="{user}",
                         help="recipient template, e.g. '{user}@example.org' (default '{user}')")
    enforce.add_argument("--mail-from", default="slurm-gpu-report", help="sender address")
    enforce.add_argument("--state-file", default=DEFAULT_ENFORCE_STATE,
                         help=f"warnings sent and cancels (default {DEFAULT_ENFORCE_STATE})")
    enforce.add_argument("--cluster", help="only series whose cluster label has this value")
    enforce.add_argument("--cluster-label", default="cluster",
                         help="the label the scrape config puts the cluster name in")
    enforce.add_argument("--verbose", "-v", action="store_true",
                         help="log each query on stderr")
    _prometheus_options(enforce)
    sub.add_parser("default-policy", help="print the default enforce policy (TOML)")
    add_remediate_command(sub)


async def _run_enforce(args: argparse.Namespace, now: float) -> int:
    policy = load_policy(args.policy)
    if args.cancel and policy.warn_after_s and not args.notify:
        raise ReportError("enforce --cancel warns users first: give --notify smtp://host or "
                          "a webhook URL (or set idle.warn_after = [] in the policy)")
    options = EnforceOptions(
        policy=policy, cancel=args.cancel, state_path=Path(args.state_file),
        filters=Filters(cluster=args.cluster, cluster_label=args.cluster_label),
        notify=args.notify, mail_to=args.mail_to, mail_from=args.mail_from)
    logging.getLogger("slurm_gpu_exporter.report.enforce").setLevel(logging.INFO)
    async with PrometheusClient(_connection(args), on_query=_log_query) as prom:
        run = await run_enforce(prom, options, now)
    dry_run = not args.cancel
    sys.stdout.write(decisions_json(run.decisions, dry_run, run.queries)
                     if args.format == "json" else decisions_table(run.decisions, dry_run))
    if run.exit_code == EXIT_DOUBTFUL:
        print("slurm-gpu-report: some jobs were skipped because their metrics cannot be "
              "trusted (see the reasons); check those agents and Prometheus",
              file=sys.stderr)
    return run.exit_code


ENFORCE_COMMANDS = ("enforce", "default-policy", "remediate")


def _enforce_command(args: argparse.Namespace) -> int:
    if args.command == "default-policy":
        sys.stdout.write(DEFAULT_POLICY)
        return 0
    if args.command == "remediate":
        return run_remediate(args)
    try:
        return asyncio.run(_run_enforce(args, time.time()))
    except ReportError as exc:
        print(f"slurm-gpu-report: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("slurm-gpu-report: interrupted; nothing more was done", file=sys.stderr)
        return 130


def _connection(args: argparse.Namespace) -> Connection:
    return Connection(
        url=args.prometheus_url, timeout_s=args.timeout, username=args.username,
        password=read_secret(args.password_file),
        bearer_token=read_secret(args.bearer_token_file), ca_file=args.ca_file,
        cert_file=args.cert_file, key_file=args.key_file,
        insecure_skip_verify=args.insecure_skip_verify)


@contextmanager
def _progress(what: str) -> Iterator[None]:
    """A spinner on the terminal while queries run; nothing when stderr is not a TTY."""
    if not sys.stderr.isatty():
        yield
        return
    from rich.console import Console

    with Console(stderr=True).status(what):
        yield


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
    chart_jobs = config.chart_jobs if args.format == "html" else 0
    store = ArchiveStore(args.db, write=False, timeout_s=args.db_timeout) if args.db else None

    def archived(window: Window) -> list:  # type: ignore[type-arg]
        assert store is not None
        with store:
            return store.ended_usage(window, args.user, args.account, args.partition,
                                     args.cluster)

    async with PrometheusClient(_connection(args), on_query=_log_query) as prom:
        with _progress("querying Prometheus…"):
            report = await low_util_report(prom, window, filters, threshold, min_gpu_hours,
                                           chart_jobs, archived if store else None)
    log.info("%d PromQL queries for %d jobs", report.queries, report.jobs_seen)
    if store is not None:
        print(f"slurm-gpu-report: {report.jobs_seen - report.from_archive} jobs from "
              f"Prometheus, {report.from_archive} ended ones only in the archive "
              f"{store.where} (whole-life figures)", file=sys.stderr)
    if args.notify or args.dry_run:
        return _notify(args, report, config, now)
    _write(args, render_low_util(report, args.format))
    return 0


def _notify(args: argparse.Namespace, report: LowUtilReport, config: Config,
            now: float) -> int:
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
        send(message, args.notify, args.mail_from)
        state.mark(jobs, now, keep_s)  # after each send: a later failure loses nothing
        print(f"sent to {message.to}: {len(jobs)} jobs")
    return 0


async def run_job(args: argparse.Namespace, config: Config, now: float) -> int:
    window = make_window(args.since, args.start, args.end, now, default_since="30d")
    filters = Filters(cluster=args.cluster, cluster_label=args.cluster_label)

    def accounting(jobids: list[str]) -> dict:  # type: ignore[type-arg]
        return {} if args.no_sacct else sacct_accounting(jobids)

    async with PrometheusClient(_connection(args), on_query=_log_query) as prom:
        with _progress("querying Prometheus…"):
            details, unknown = await job_report(prom, window, list(dict.fromkeys(args.jobids)),
                                                filters, config, accounting, now)
        log.info("%d PromQL queries for %d jobs", prom.queries, len(args.jobids))
        queries = prom.queries
    if unknown and args.db:
        details, unknown = _from_archive(args, details, unknown)
    if details:
        _write(args, render_jobs(details, args.format, queries))
    if unknown:
        if args.db:
            raise ReportError(f"no metrics for job {', '.join(unknown)} in Prometheus in the "
                              "window, nor in the archive; check the id, or widen --since",
                              EXIT_UNKNOWN_JOB)
        raise unknown_jobs_error(unknown, window)
    return 0


def _from_archive(args: argparse.Namespace, details: list[JobDetail], unknown: list[str]
                  ) -> tuple[list[JobDetail], list[str]]:
    """The jobs Prometheus has no samples of, from the archive, in the order asked."""
    with ArchiveStore(args.db, write=False, timeout_s=args.db_timeout) as store:
        archived = store.details(unknown, args.cluster)
    order = {jobid: i for i, jobid in enumerate(args.jobids)}
    for jobid in unknown:
        for detail, archived_at in archived.get(jobid, []):
            # A note, so every format says it the way it says the rest of the job.
            detail.notes.insert(0, f"From the job archive ({store.where}, archived "
                                   f"{when(archived_at)}): Prometheus has no samples of this "
                                   "job in the window.")
            details.append(detail)
    details.sort(key=lambda d: order.get(d.usage.jobid, len(order)))
    return details, [j for j in unknown if j not in archived]


async def run_archive(args: argparse.Namespace, config: Config, now: float) -> int:
    window = make_window(args.since, args.start, args.end, now, default_since="2h")
    filters = Filters(cluster=args.cluster, cluster_label=args.cluster_label)

    def accounting(window: Window) -> dict:  # type: ignore[type-arg]
        return {} if args.no_sacct else sacct_window(window.start, window.end)

    with ArchiveStore(args.db, write=True, timeout_s=args.db_timeout) as store:
        async with PrometheusClient(_connection(args), on_query=_log_query) as prom:
            with _progress("querying Prometheus…"):
                run = await archive(prom, store, window, filters, config, accounting, now)
    print(f"archived {run.stored} jobs that ended by {when(window.end)} into {store.where} "
          f"({run.batches} batches, {run.queries} PromQL queries)")
    return 0


def run_usage(args: argparse.Namespace) -> int:
    now = time.time()
    if args.month and (args.since or args.start or args.end):
        raise ReportError("give either --month or --since/--start/--end, not both")
    window = (month_window(args.month, now) if args.month
              else make_window(args.since, args.start, args.end, now, default_since="30d"))
    with ArchiveStore(args.db, write=False, timeout_s=args.db_timeout) as store:
        report = usage_report(store, window, args.by, args.cluster)
    _write(args, render_usage(report, args.format, color=_color()))
    return 0


def _log_query(query: str) -> None:
    log.debug("query: %s", query)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="slurm-gpu-report: %(message)s",
                        stream=sys.stderr)
    if getattr(args, "verbose", False):
        log.setLevel(logging.DEBUG)
    if args.command == "default-config":
        sys.stdout.write(DEFAULT_CONFIG)
        return 0
    if args.command in ENFORCE_COMMANDS:
        return _enforce_command(args)
    try:
        if args.command == "usage":
            return run_usage(args)
        config = load_config(args.config)
        runners = {"job": run_job, "low-util": run_low_util, "archive": run_archive}
        return asyncio.run(runners[args.command](args, config, time.time()))
    except ReportError as exc:
        print(f"slurm-gpu-report: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("slurm-gpu-report: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


__all__ = ["EXIT_NOTIFY", "main"]
