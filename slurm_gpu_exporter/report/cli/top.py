"""``slurm-gpu-report top JOBID``: one running job, refreshed every ``--interval``
seconds until it ends, then its summary (the ``job`` report) and exit 0.

Each frame is the ``job`` report's queries over the job's life (the first frame looks
back 30 days for its start, later ones from the start on) plus ``top.now``'s, a fixed
number whatever the job's size. A job Prometheus does not know yet but Slurm lists as
running or pending is waited for (``top.wait``, ``--wait``), after the refusal of another
user's job. ^C leaves quietly, at once (``top.interrupt``).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import pwd
import shutil
import sys
import time

from slurm_gpu_exporter.report.cli.flags import munge_auth, prometheus
from slurm_gpu_exporter.report.cli.reports import (
    EXIT_UNKNOWN_JOB,
    job_report,
    not_yours_error,
    refuse_others_jobs,
    unknown_jobs_error,
)
from slurm_gpu_exporter.report.errors import ReportError
from slurm_gpu_exporter.report.figures.rules import Config
from slurm_gpu_exporter.report.figures.shapes import JobDetail
from slurm_gpu_exporter.report.figures.window import Window, make_window
from slurm_gpu_exporter.report.prometheus.array_tasks import resolve_array_tasks
from slurm_gpu_exporter.report.prometheus.client import PrometheusClient
from slurm_gpu_exporter.report.prometheus.queries import (
    Filters,
    jobid_regex,
)
from slurm_gpu_exporter.report.render.text import job_table
from slurm_gpu_exporter.report.render.values import when
from slurm_gpu_exporter.report.slurm.actions import listed_jobs
from slurm_gpu_exporter.report.top.frame import frame
from slurm_gpu_exporter.report.top.interrupt import interrupt_event, until_interrupted
from slurm_gpu_exporter.report.top.now import STALE_AFTER_S, JobNow, fetch_now
from slurm_gpu_exporter.report.top.wait import (
    SlurmSays,
    first_sample,
    no_sample_hint,
    wait_left,
    waiting_line,
)

CLEAR = "\x1b[H\x1b[2J"  # cursor home, clear the screen
MIN_INTERVAL_S = 1.0
SLACK_S = 60.0  # before the job's start: its first samples' window


def top_command(args: argparse.Namespace, config: Config) -> int:
    """Run ``top``; ^C is the normal way out of a live view: exit 0, no message."""
    if args.interval < MIN_INTERVAL_S:
        raise ReportError(f"bad --interval {args.interval:g}: give {MIN_INTERVAL_S:g} second "
                          "or more")
    if not (math.isfinite(args.wait) and args.wait >= 0):
        raise ReportError(f"bad --wait {args.wait:g}: give 0 seconds (do not wait) or more")
    jobid_regex([args.jobid])
    try:
        return asyncio.run(_top(args, config))
    except KeyboardInterrupt:
        return 0


Frame = tuple[JobDetail, JobNow, float]


async def _frame(prom: PrometheusClient, args: argparse.Namespace, config: Config,
                 start: float | None) -> Frame | None:
    """The job's figures now; None where Prometheus does not know the job."""
    at = time.time()
    window = (Window(start - SLACK_S, at) if start is not None
              else make_window(None, None, None, at, default_since="30d"))
    filters = Filters(cluster=args.cluster, cluster_label=args.cluster_label)
    details, unknown = await job_report(prom, window, [args.jobid], filters, config,
                                        lambda _: {}, at)
    if unknown:
        return None
    return details[0], await fetch_now(prom, args.jobid, filters, at), at


def _slurm_says(asked: str) -> SlurmSays | None:
    """The job as squeue lists it (by its own id, or as users know it: ``1234_5``); None
    where squeue does not list it, or cannot be asked (not installed, failing)."""
    try:
        listed = listed_jobs()
    except ReportError:
        return None
    job = listed.get(asked) or next((j for j in listed.values() if j.shown == asked), None)
    return None if job is None else SlurmSays(job.jobid, job.user, job.state, job.start)


async def _first_frame(prom: PrometheusClient, args: argparse.Namespace, config: Config
                       ) -> Frame:
    """The first frame; a job Prometheus does not know yet is refused if it is another
    user's, waited for if Slurm runs it (or will), else unknown (exit 5)."""
    got = await _frame(prom, args, config, None)
    if got is not None:
        return got
    asked = args.jobid
    munge = munge_auth(args)
    if munge:  # through the proxy another user's job looks unknown
        refuse_others_jobs([asked])
    job = _slurm_says(asked)
    if munge and job is not None and job.user not in ("", pwd.getpwuid(os.getuid()).pw_name):
        raise not_yours_error([asked])  # Slurm's owner where sacct knows none; before any wait
    left = wait_left(job, args.wait, time.time())
    if job is not None and left > 0:
        print(waiting_line(asked, job, left), file=sys.stderr, flush=True)
        args.jobid = job.jobid  # an array task unknown to Prometheus: its own id
        got = await first_sample(lambda: _frame(prom, args, config, None), left,
                                 args.interval)
    if got is None:
        window = make_window(None, None, None, time.time(), default_since="30d")
        raise ReportError(f"{unknown_jobs_error([asked], window)}"
                          f"{no_sample_hint(job, args.wait)}", EXIT_UNKNOWN_JOB)
    return got


async def _top(args: argparse.Namespace, config: Config) -> int:
    async with prometheus(args) as prom:
        with interrupt_event() as interrupted:
            return await _frames(prom, args, config, interrupted)


async def _frames(prom: PrometheusClient, args: argparse.Namespace, config: Config,
                  interrupted: asyncio.Event) -> int:
    """Draw frames until the job ends (0) or ^C (0, at once, whatever was running)."""
    tty = sys.stdout.isatty()
    color = tty and "NO_COLOR" not in os.environ
    # An array task asked as users know it (1234_5) is followed by its own job id.
    window = make_window(None, None, None, time.time(), default_since="30d")
    filters = Filters(cluster=args.cluster, cluster_label=args.cluster_label)
    stopped, ids = await until_interrupted(
        resolve_array_tasks(prom, window, [args.jobid], filters), interrupted)
    if stopped or ids is None:
        return 0
    args.jobid = ids[0]
    stopped, got = await until_interrupted(_first_frame(prom, args, config), interrupted)
    while not stopped and got is not None:
        detail, live, at = got
        start = detail.start
        if not detail.running or live.stale(at):
            sys.stdout.write((CLEAR if tty and not args.once else "")
                             + job_table([detail], color=color) + _ended(detail) + "\n")
            return 0
        width = shutil.get_terminal_size((110, 24)).columns if tty else 110
        page = frame(detail, live, at, None if args.once else args.interval,
                     width=max(80, width), color=color)
        if args.once:
            sys.stdout.write(page)
            return 0
        sys.stdout.write(CLEAR + page if tty else page + "\n")
        sys.stdout.flush()
        stopped, _ = await until_interrupted(
            asyncio.sleep(max(0.0, args.interval - (time.time() - at))), interrupted)
        if stopped:
            break
        stopped, got = await until_interrupted(_frame(prom, args, config, start),
                                               interrupted)
        if not stopped and got is None:
            raise unknown_jobs_error([args.jobid], Window(start or at, time.time()))
    return 0


def _ended(detail: JobDetail) -> str:
    if not detail.running:
        return f"Job {detail.usage.jobid} ended at {when(detail.end)}."
    return (f"Job {detail.usage.jobid}: no sample for {STALE_AFTER_S:.0f} s; it ended or its "
            "node stopped reporting.")
