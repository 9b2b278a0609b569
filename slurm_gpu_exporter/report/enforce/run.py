"""``slurm-gpu-report enforce``: warn, then cancel, the jobs whose GPUs sit idle.

One run: the idle windows from Prometheus (a fixed number of queries), the running
jobs from one ``squeue``, the decisions, and with ``--cancel`` the actions: each
warning sent once through the notify channel and remembered, each cancel recorded
in the job's AdminComment before ``scancel``. A failed query or squeue raises before
any decision, so the run acts on nothing. Each action is logged in one line.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slurm_gpu_exporter.report.enforce.decisions import Decision, decide
from slurm_gpu_exporter.report.enforce.idle_window import fetch_idleness
from slurm_gpu_exporter.report.enforce.policy import Policy, span
from slurm_gpu_exporter.report.enforce.state import EXIT_STATE, EnforceState
from slurm_gpu_exporter.report.errors import ReportError
from slurm_gpu_exporter.report.figures.rules import render_template
from slurm_gpu_exporter.report.inert_text import plain
from slurm_gpu_exporter.report.notify.relay import PLAIN_SMTP, RelayLogin
from slurm_gpu_exporter.report.notify.send import EXIT_NOTIFY, Message, make_message, send
from slurm_gpu_exporter.report.prometheus.client import PrometheusClient
from slurm_gpu_exporter.report.prometheus.queries import Filters
from slurm_gpu_exporter.report.render.values import when
from slurm_gpu_exporter.report.slurm.actions import (
    EXIT_SLURM,
    cancel_job,
    listed_jobs,
    record_reason,
    still_as_listed,
)

log = logging.getLogger(__name__)

# Some jobs were skipped because their data could not be trusted.
EXIT_DOUBTFUL = 7


@dataclass(frozen=True)
class EnforceOptions:
    policy: Policy
    cancel: bool
    state_path: Path
    filters: Filters
    notify: str | None = None
    mail_to: str = "{user}"
    mail_from: str = "slurm-gpu-report"
    # A site's label naming a GPU's Slurm node (port dropped); None: the agents' own.
    node_label: str | None = None
    login: RelayLogin = PLAIN_SMTP  # STARTTLS and AUTH for --notify smtp://


@dataclass(frozen=True)
class EnforceRun:
    decisions: list[Decision]
    queries: int
    exit_code: int


def message_facts(decision: Decision, policy: Policy) -> dict[str, Any]:
    """What the message templates may name, for one decision."""
    return {
        # what the user would scancel: an array task's A_T, a het job's leader id
        "jobid": decision.target, "name": decision.name or "-", "user": decision.user,
        "account": decision.account, "partition": decision.partition, "gpus": decision.gpus,
        "nodes": ", ".join(decision.nodes), "idle_for": span(decision.idle_for_s or 0),
        "cancel_after": span(policy.cancel_after_s), "cancel_at": when(decision.cancel_at),
        "warning": decision.warning or 0, "warnings": len(policy.warn_after_s),
        "busy_fraction": policy.busy_fraction,
    }


def cancel_reason(decision: Decision, now: float) -> str:
    """What the job's AdminComment says; only our own words and numbers, no user text."""
    return (f"slurm-gpu-report enforce: cancelled {when(now)}, GPUs {decision.reason}")


def _message(decision: Decision, policy: Policy, options: EnforceOptions, subject: str,
             body: str) -> Message:
    facts = message_facts(decision, policy)
    return make_message(decision.user, options.mail_to, render_template(subject, facts),
                        render_template(body, facts).strip() + "\n", (decision.jobid,))


async def run_enforce(prom: PrometheusClient, options: EnforceOptions, now: float
                      ) -> EnforceRun:
    """Decide, and with ``options.cancel`` act; the exit code says what went wrong.

    One job's failure (a message that cannot be made or sent, a Slurm command that
    fails) is that job's error line and its exit code; the run goes on with the others.
    A state file that cannot be written stops the run: what was sent would be forgotten."""
    policy = options.policy
    state = EnforceState(options.state_path)  # a broken state file stops the run first
    jobs = await fetch_idleness(prom, policy.windows_s, options.filters, policy.busy_fraction,
                                now, options.node_label)
    slurm = listed_jobs()
    decisions = decide(jobs, slurm, state.warnings(), policy, now)
    failures: set[int] = set()
    if options.cancel:
        if options.notify is None and any(d.action == "warn" for d in decisions):
            raise ReportError("enforce --cancel has a warning to send and no --notify "
                              "channel: give --notify smtp://… or a webhook URL")
        failures |= act_all(decisions, state, options, now)
        state.keep_only({jobid for jobid, job in slurm.items() if job.running})
    if any(d.doubtful for d in decisions):
        failures.add(EXIT_DOUBTFUL)
    code = next((c for c in (EXIT_SLURM, EXIT_NOTIFY, EXIT_DOUBTFUL) if c in failures),
                max(failures, default=0))
    return EnforceRun(decisions, prom.queries, code)


def act_all(decisions: list[Decision], state: EnforceState, options: EnforceOptions,
            now: float) -> set[int]:
    """Carry out every decision; the exit codes of the jobs that failed. One job's
    failure is its error line; only a state file that cannot be written stops here."""
    failures = set()
    for decision in decisions:
        try:
            failure = act_on(decision, state, options, now)
        except ReportError as exc:
            if exc.exit_code == EXIT_STATE:
                raise
            log.error("job %s: %s", decision.shown, plain(exc))
            failure = exc.exit_code
        if failure:
            failures.add(failure)
    return failures


def act_on(decision: Decision, state: EnforceState, options: EnforceOptions,
           now: float) -> int:
    """Carry out one decision; the exit code of a failure, or 0."""
    policy = options.policy
    who = f"job {decision.shown} ({plain(decision.user)})"
    if decision.forget_warnings:
        state.forget_warnings(decision.jobid)
        log.info("%s used its GPUs again: its warnings are forgotten", who)
    if decision.action == "warn" and options.notify is not None:
        try:
            send(_message(decision, policy, options, policy.warning_subject,
                          policy.warning), options.notify, options.mail_from, options.login)
        except ReportError as exc:
            log.error("%s: warning %s not sent, retried next run: %s", who, decision.warning,
                      plain(exc))
            return EXIT_NOTIFY
        state.add_warning(decision.jobid, now)
        log.info("warned %s: warning %s of %d, %s", who, decision.warning,
                 len(policy.warn_after_s), plain(decision.reason))
    elif decision.action == "cancel":
        listed = decision.slurm
        if listed is None or listed.ident is None or not still_as_listed(decision.components):
            log.warning("%s not cancelled: Slurm no longer runs it as this run saw it "
                        "(ended, requeued or changed since); left for the next run", who)
            return EXIT_DOUBTFUL
        try:
            record_reason(listed.ident, cancel_reason(decision, now))
            cancel_job(listed.ident)
        except ReportError as exc:
            log.error("%s not cancelled: %s", who, plain(exc))
            return EXIT_SLURM
        state.add_cancel(decision.jobid, now)
        log.info("cancelled %s: %s", who, plain(decision.reason))
        if options.notify is not None:
            try:
                send(_message(decision, policy, options, policy.cancel_subject,
                              policy.cancel), options.notify, options.mail_from, options.login)
            except ReportError as exc:
                log.error("%s was cancelled; telling the user failed: %s", who, plain(exc))
                return EXIT_NOTIFY
    return 0
