"""Telling users about their flagged jobs, at most once a week per job.

Each flagged user gets one message listing their own jobs, made from the site's
templates (sent by ``notify.send``: SMTP or a webhook). A state file remembers when
each job was reported, so a job is not reported again within ``repeat_after_days``;
it is written only after a send succeeded, and atomically.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from slurm_gpu_exporter.report.errors import ReportError
from slurm_gpu_exporter.report.figures.rules import Config, render_template
from slurm_gpu_exporter.report.figures.shapes import JobUsage, LowUtilReport
from slurm_gpu_exporter.report.inert_text import plain
from slurm_gpu_exporter.report.notify.send import EXIT_NOTIFY, Message, make_message
from slurm_gpu_exporter.report.private_file import write_private
from slurm_gpu_exporter.report.render.values import when

log = logging.getLogger(__name__)

def _job_key(job: JobUsage) -> str:
    return f"{job.cluster}/{job.jobid}" if job.cluster else job.jobid


class NotifyState:
    """When each job was last reported: a JSON file of job key -> Unix time."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self.sent: dict[str, float] = json.loads(path.read_text())
        except FileNotFoundError:
            self.sent = {}
        except (OSError, ValueError) as exc:
            raise ReportError(f"cannot read the notify state {path}: {exc}; fix or remove "
                              "it", EXIT_NOTIFY) from None

    def due(self, job: JobUsage, now: float, repeat_after_s: float) -> bool:
        last = self.sent.get(_job_key(job))
        return last is None or now - last >= repeat_after_s

    def mark(self, jobs: list[JobUsage], now: float, keep_s: float) -> None:
        for job in jobs:
            self.sent[_job_key(job)] = now
        # Forget what can no longer suppress anything, so the file stays small.
        self.sent = {k: t for k, t in self.sent.items() if now - t < keep_s}
        body = (json.dumps(self.sent, indent=1, sort_keys=True) + "\n").encode()
        write_private(self.path, body, "the notify state", EXIT_NOTIFY)


def messages(report: LowUtilReport, config: Config, state: NotifyState, now: float,
             address: str) -> list[tuple[Message, list[JobUsage]]]:
    """One message per flagged user, with the jobs not reported recently."""
    repeat_after_s = config.repeat_after_days * 86400
    by_user: dict[str, list[JobUsage]] = {}
    for job in report.flagged:
        if job.user and state.due(job, now, repeat_after_s):
            by_user.setdefault(job.user, []).append(job)
    out = []
    for user, jobs in sorted(by_user.items()):
        lines = [render_template(config.job_line, _job_facts(job)) for job in jobs]
        facts: dict[str, Any] = {
            "user": user, "count": len(jobs), "jobs": "\n".join(lines),
            "start": when(report.window.start), "end": when(report.window.end),
            "gpu_hours": sum(j.gpu_hours for j in jobs),
            "wasted_gpu_hours": sum(j.wasted_gpu_hours for j in jobs),
            "threshold": report.threshold,
        }
        try:
            message = make_message(user, address, render_template(config.subject, facts),
                                   render_template(config.template, facts).strip() + "\n",
                                   tuple(j.jobid for j in jobs))
        except ReportError as exc:
            log.warning("%s", exc)
            continue
        out.append((message, jobs))
    return out


def _job_facts(job: JobUsage) -> dict[str, Any]:
    return {"jobid": plain(job.jobid), "name": plain(job.name or "-"), "user": job.user,
            "account": plain(job.account), "partition": plain(job.partition),
            "gpus": job.gpus,
            "gpu_hours": job.gpu_hours, "busy_ratio": job.busy_ratio or 0.0,
            "idle_gpus": job.idle_gpus, "wasted_gpu_hours": job.wasted_gpu_hours}
