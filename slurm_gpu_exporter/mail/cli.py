"""``slurm-gpu-mail``: slurm.conf's MailProg. slurmctld runs it as it would run
``mail``: ``slurm-gpu-mail -s SUBJECT USER`` with the job in SLURM_JOB_* variables. For
an end-of-job mail the job's summary is added to the message; then the message goes to
the real mailer with Slurm's own arguments. Whatever fails on the way to the summary
(Prometheus, the report, a job shorter than a sample), the mail goes as Slurm wrote it,
and the reason is logged; a wrong key in the config costs only that key. The summary and
the mailer share one budget inside slurmctld's 120 s (budget.py), the mailer's part kept
for it. ``--check`` checks the config (check.py)."""

from __future__ import annotations

import logging
import logging.handlers
import os
import subprocess
import sys
import time
from pathlib import Path

from slurm_gpu_exporter.mail.budget import mailer_time, summary_time_left
from slurm_gpu_exporter.mail.check import check_main, is_check
from slurm_gpu_exporter.mail.config import (
    CONFIG_ENV,
    DEFAULT_CONFIG,
    MailConfig,
    config_path,
    load_mail_config,
)
from slurm_gpu_exporter.mail.summary import (
    CONTROL,
    NoSummary,
    jobid_to_summarize,
    mail_subject,
    report_json,
    summary_text,
)

log = logging.getLogger("slurm_gpu_exporter.mail")
SYSLOG = "/dev/log"


def _setup_logging(log_file: Path | None) -> None:
    log.setLevel(logging.INFO)
    log.propagate = False
    stderr = logging.StreamHandler(sys.stderr)
    stderr.setFormatter(logging.Formatter("slurm-gpu-mail: %(message)s"))
    log.addHandler(stderr)
    if os.path.exists(SYSLOG):
        try:
            syslog = logging.handlers.SysLogHandler(address=SYSLOG)
        except OSError:
            pass
        else:
            syslog.setFormatter(logging.Formatter("slurm-gpu-mail: %(message)s"))
            log.addHandler(syslog)
    if log_file is not None:
        try:
            handler = logging.FileHandler(log_file)
        except OSError as exc:
            log.warning("cannot write %s: %s", log_file, exc.strerror)
        else:
            handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
            log.addHandler(handler)


def _slurms_body() -> bytes:
    """What Slurm wrote on stdin (usually nothing: slurmctld gives /dev/null)."""
    try:
        if os.isatty(0):
            return b""
        return sys.stdin.buffer.read()
    except (OSError, ValueError, AttributeError):
        return b""  # stdin closed


def _summary(config: MailConfig, started: float, argv: list[str]) -> tuple[bytes, str]:
    """The text to add and what happened, or (b"", why not)."""
    try:
        jobid = jobid_to_summarize(os.environ, mail_subject(argv))
        left = summary_time_left(config.summary_timeout_s, config.mailer_timeout_s,
                                 time.monotonic() - started)
        if not left:
            raise NoSummary("no time left for the summary")
        text = summary_text(report_json(config, jobid, left))
    except NoSummary as exc:
        return b"", f"as Slurm wrote it: {exc}"
    except Exception as exc:  # never lose the mail over a summary
        return b"", f"as Slurm wrote it: {type(exc).__name__}: {exc}"
    return text.encode(), f"summary of job {jobid} added"


def inert_arguments(argv: list[str]) -> list[str]:
    """Slurm's arguments with control characters made spaces: the subject holds the job
    name, which a user chose, and a newline there would start a header of its own."""
    return [CONTROL.sub(" ", arg) for arg in argv]


def deliver(mailer: str, argv: list[str], message: bytes,
            timeout_s: float) -> tuple[int, str | None]:
    """Hand ``message`` to ``mailer`` with Slurm's arguments: the exit status (the
    mailer's own, or 1) and what went wrong (None when the mailer took it)."""
    try:
        proc = subprocess.run([mailer, *inert_arguments(argv)], input=message,
                              timeout=timeout_s, check=False)
    except OSError as exc:
        return 1, f"cannot run the mailer {mailer}: {exc.strerror}; set mailer in {config_path()}"
    except subprocess.TimeoutExpired:
        return 1, f"the mailer {mailer} did not finish within {timeout_s:.1f} s"
    if proc.returncode != 0:
        return proc.returncode, f"the mailer {mailer} exited with {proc.returncode}"
    return 0, None


USAGE = """usage: slurm-gpu-mail -s SUBJECT USER   (slurm.conf: MailProg=/PATH/slurm-gpu-mail)

slurmctld's MailProg: adds the job's GPU and CPU efficiency summary to Slurm's
end-of-job mail, then runs the real mailer (default /usr/bin/mail) with Slurm's own
arguments. Config: {config} (env {env}). See docs/users.md.

       slurm-gpu-mail --check [--config PATH]
checks the config: one line per problem, exit 1 if any.
"""


def main(argv: list[str] | None = None) -> int:
    started = time.monotonic()
    args = sys.argv[1:] if argv is None else argv
    if args in (["--help"], ["-h"]):  # a person asking; Slurm always passes -s SUBJECT USER
        print(USAGE.format(config=DEFAULT_CONFIG, env=CONFIG_ENV), end="")
        return 0
    if is_check(args):
        return check_main(args)
    body = _slurms_body()
    path = config_path()
    loaded = load_mail_config(path)
    config = loaded.config
    _setup_logging(config.log_file)
    for problem in loaded.problems:  # each costs its own key only: the rest still holds
        log.error("%s", problem.line(path))
    job = os.environ.get("SLURM_JOB_ID", "-")[:20]
    addition, what = _summary(config, started, args)
    if addition:
        body += (b"\n" if not body.endswith(b"\n") else b"") + b"\n" + addition if body \
            else addition
    status, failed = deliver(config.mailer, args, body,
                             mailer_time(config.mailer_timeout_s, time.monotonic() - started))
    took = time.monotonic() - started
    if failed is None:
        log.info("job %s: %s (%.1f s)", job, what if addition else f"mail sent {what}", took)
        return 0
    log.error("job %s: mail NOT sent: %s (it was to go %s) (%.1f s)", job, failed,
              "with the summary" if addition else what, took)
    return status


if __name__ == "__main__":
    sys.exit(main())
