"""``slurm-gpu-mail``: slurm.conf's MailProg. slurmctld runs it as it would run
``mail``: ``slurm-gpu-mail -s SUBJECT USER`` with the job in SLURM_JOB_* variables. For
an end-of-job mail the job's summary is added to the message; then the message goes to
the real mailer with Slurm's own arguments. Whatever fails on the way to the summary
(the config, Prometheus, the report, a job shorter than a sample), the mail goes as
Slurm wrote it, within the summary's time limit, and the reason is logged."""

from __future__ import annotations

import logging
import logging.handlers
import os
import subprocess
import sys
import time
from pathlib import Path

from slurm_gpu_exporter.mail.config import (
    CONFIG_ENV,
    DEFAULT_CONFIG,
    MailConfig,
    MailConfigError,
    config_path,
    load_mail_config,
)
from slurm_gpu_exporter.mail.summary import (
    CONTROL,
    NoSummary,
    jobid_to_summarize,
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


def _summary(config: MailConfig, started: float) -> tuple[bytes, str]:
    """The text to add and what happened, or (b"", why not)."""
    try:
        jobid = jobid_to_summarize(os.environ)
        left = config.summary_timeout_s - (time.monotonic() - started)
        text = summary_text(report_json(config, jobid, max(0.5, left)))
    except NoSummary as exc:
        return b"", f"mail sent as Slurm wrote it: {exc}"
    except Exception as exc:  # never lose the mail over a summary
        return b"", f"mail sent as Slurm wrote it: {type(exc).__name__}: {exc}"
    return text.encode(), f"summary of job {jobid} added"


def inert_arguments(argv: list[str]) -> list[str]:
    """Slurm's arguments with control characters made spaces: the subject holds the job
    name, which a user chose, and a newline there would start a header of its own."""
    return [CONTROL.sub(" ", arg) for arg in argv]


def deliver(mailer: str, argv: list[str], message: bytes, timeout_s: float) -> int:
    """Hand ``message`` to ``mailer`` with Slurm's arguments; its exit status."""
    try:
        proc = subprocess.run([mailer, *inert_arguments(argv)], input=message,
                              timeout=timeout_s, check=False)
    except OSError as exc:
        log.error("cannot run the mailer %s: %s; set mailer in %s", mailer, exc.strerror,
                  config_path())
        return 1
    except subprocess.TimeoutExpired:
        log.error("the mailer %s did not finish within %g s", mailer, timeout_s)
        return 1
    if proc.returncode != 0:
        log.error("the mailer %s exited with %d", mailer, proc.returncode)
    return proc.returncode


USAGE = """usage: slurm-gpu-mail -s SUBJECT USER   (slurm.conf: MailProg=/PATH/slurm-gpu-mail)

slurmctld's MailProg: adds the job's GPU and CPU efficiency summary to Slurm's
end-of-job mail, then runs the real mailer (default /usr/bin/mail) with Slurm's own
arguments. Config: {config} (env {env}). See docs/users.md.
"""


def main(argv: list[str] | None = None) -> int:
    started = time.monotonic()
    args = sys.argv[1:] if argv is None else argv
    if args in (["--help"], ["-h"]):  # a person asking; Slurm always passes -s SUBJECT USER
        print(USAGE.format(config=DEFAULT_CONFIG, env=CONFIG_ENV), end="")
        return 0
    body = _slurms_body()
    problem = None
    try:
        config = load_mail_config(config_path())
    except MailConfigError as exc:
        config, problem = MailConfig(), str(exc)
    _setup_logging(config.log_file)
    job = os.environ.get("SLURM_JOB_ID", "-")[:20]
    if problem is not None:
        addition, what = b"", f"mail sent as Slurm wrote it: {problem}"
    else:
        addition, what = _summary(config, started)
    if addition:
        body += (b"\n" if not body.endswith(b"\n") else b"") + b"\n" + addition if body \
            else addition
    log.info("job %s: %s (%.1f s)", job, what, time.monotonic() - started)
    return deliver(config.mailer, args, body, config.mailer_timeout_s)


if __name__ == "__main__":
    sys.exit(main())
