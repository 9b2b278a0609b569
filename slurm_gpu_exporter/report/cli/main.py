"""``slurm-gpu-report``: ``job JOBID…``, ``low-util`` and ``top JOBID`` from Prometheus;
``archive`` into the job archive, and ``usage`` from it; ``mlflow`` (ended jobs' figures
into their MLflow runs); ``enforce`` (warn, then cancel,
idle GPU jobs) and ``remediate`` (drain nodes on GPU faults).

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
from collections.abc import Callable, Sequence

from slurm_gpu_exporter.report.cli.commands import (
    run_archive,
    run_enforce_command,
    run_job,
    run_low_util,
    run_usage,
)
from slurm_gpu_exporter.report.cli.flags import build_parser, prometheus
from slurm_gpu_exporter.report.cli.mlflow import run_mlflow
from slurm_gpu_exporter.report.cli.remediate import run_remediate
from slurm_gpu_exporter.report.cli.top import top_command
from slurm_gpu_exporter.report.enforce.policy import DEFAULT_POLICY
from slurm_gpu_exporter.report.errors import ReportError
from slurm_gpu_exporter.report.figures.defaults import DEFAULT_CONFIG
from slurm_gpu_exporter.report.figures.rules import load_config
from slurm_gpu_exporter.report.notify.send import EXIT_NOTIFY

log = logging.getLogger("slurm_gpu_exporter.report")

ENFORCE_COMMANDS = ("enforce", "default-policy", "remediate")


def _reported(run: Callable[[], int], interrupted: str = "interrupted",
              closed_stdout_is_ok: bool = True) -> int:
    """Run a command: a ReportError is its one line on stderr and its exit status, ^C is
    130, and a reader that closed stdout early is 0 (where ``closed_stdout_is_ok``) or a
    line on stderr and 1."""
    try:
        return run()
    except ReportError as exc:
        print(f"slurm-gpu-report: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print(f"slurm-gpu-report: {interrupted}", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # Python flushes stdout again at exit: point it at /dev/null so that says nothing.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        if closed_stdout_is_ok:
            return 0
        print("slurm-gpu-report: stdout was closed before the output was written; what "
              "was done is on stderr and in the state file", file=sys.stderr)
        return 1


def _enforce_command(args: argparse.Namespace) -> int:
    if args.command == "default-policy":
        sys.stdout.write(DEFAULT_POLICY)
        return 0
    if args.command == "remediate":
        return run_remediate(args, prometheus)
    # enforce's exit status says whether jobs were skipped or an action failed: a closed
    # stdout does not make that 0.
    return _reported(lambda: asyncio.run(run_enforce_command(args, time.time())),
                     interrupted="interrupted; nothing more was done",
                     closed_stdout_is_ok=False)


def _report_command(args: argparse.Namespace) -> int:
    if args.command == "usage":
        return run_usage(args)
    config = load_config(args.config)
    if args.command == "top":
        return top_command(args, config)
    runners = {"job": run_job, "low-util": run_low_util, "archive": run_archive,
               "mlflow": run_mlflow}
    return asyncio.run(runners[args.command](args, config, time.time()))


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
    return _reported(lambda: _report_command(args))


__all__ = ["EXIT_NOTIFY", "main"]
