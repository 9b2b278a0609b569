"""``low-util --report-to/--out-dir``: the admins' review, mailed and written as a
dated file.

The flags are checked before any query (a typo in an address fails at once, not after
minutes of queries). The file is written first, so a mail server that is down loses
nothing: the exit status says the mail failed and the message says where the file is.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from slurm_gpu_exporter.report.cli.flags import DEFAULT_SMTP
from slurm_gpu_exporter.report.errors import ReportError
from slurm_gpu_exporter.report.figures.shapes import LowUtilReport
from slurm_gpu_exporter.report.notify.relay import PLAIN_SMTP, RelayLogin
from slurm_gpu_exporter.report.notify.review import (
    parse_recipients,
    review_file_name,
    review_html,
    review_message,
)
from slurm_gpu_exporter.report.notify.run_login import login_for, sends_smtp
from slurm_gpu_exporter.report.notify.send import send_mail, smtp_server
from slurm_gpu_exporter.report.private_file import write_private
from slurm_gpu_exporter.report.relay_settings import NO_SETTINGS, RelaySettings

# Read by the admins' group (a web server that serves the directory, say), no one else:
# it names users and their jobs.
REVIEW_FILE_MODE = 0o640


@dataclass(frozen=True)
class ReviewPlan:
    recipients: tuple[str, ...]
    server: tuple[str, int]
    out_dir: Path | None
    login: RelayLogin = PLAIN_SMTP  # STARTTLS and AUTH (--smtp-starttls, --smtp-user …)


def review_plan(args: argparse.Namespace,
                settings: RelaySettings = NO_SETTINGS) -> ReviewPlan | None:
    """What ``--report-to``, ``--smtp`` and ``--out-dir`` ask for, checked; None when
    none of them is given (the report goes to stdout as before)."""
    if not (args.report_to or args.out_dir):
        if args.smtp is not None:
            raise ReportError("--smtp is the server for --report-to's mail: add --report-to "
                              "ADDR[,ADDR…]")
        return None
    if args.notify or args.dry_run:
        raise ReportError("--report-to/--out-dir (the admins' review) and --notify/--dry-run "
                          "(the users' notices) are two runs: give them in two commands")
    if args.output:
        raise ReportError("the review goes to --report-to and --out-dir, not --output: drop "
                          "--output")
    recipients = parse_recipients(args.report_to) if args.report_to is not None else ()
    server = smtp_server(args.smtp or DEFAULT_SMTP)
    if args.smtp is not None and not recipients:
        raise ReportError("--smtp is the server for --report-to's mail: add --report-to "
                          "ADDR[,ADDR…]")
    return ReviewPlan(recipients=recipients, server=server,
                      out_dir=Path(args.out_dir) if args.out_dir else None,
                      login=smtp_login(args, settings))


def smtp_login(args: argparse.Namespace,
               settings: RelaySettings = NO_SETTINGS) -> RelayLogin:
    """What the ``--smtp-*`` login flags, over the config's ``[notify]`` keys, ask for:
    for a run that mails through SMTP (``--report-to``, ``--notify smtp://…``)."""
    return login_for(args, settings, bool(args.report_to) or sends_smtp(args.notify),
                     args.dry_run)


def deliver_review(report: LowUtilReport, plan: ReviewPlan, sender: str,
                   cluster: str | None) -> int:
    """Write the dated file, then mail the admins; each says what it did on stdout."""
    html = review_html(report)
    written: Path | None = None
    file_error: ReportError | None = None
    if plan.out_dir is not None:
        path = plan.out_dir / review_file_name(report, cluster)
        try:
            write_private(path, html.encode(), "the review", mode=REVIEW_FILE_MODE)
            written = path
            print(f"wrote the review ({len(report.flagged)} flagged jobs) to {path}")
        except ReportError as exc:
            file_error = exc  # the mail still goes out: then this is said and exits
    if plan.recipients:
        mail = review_message(report, plan.recipients, sender, html)
        try:
            send_mail(mail, plan.server, plan.recipients, plan.login)
        except ReportError as exc:
            kept = (f"; the review is in {written}" if written is not None
                    else f"; and {file_error}" if file_error is not None else "")
            raise ReportError(f"{exc}{kept}", exc.exit_code) from None
        print(f"sent the review ({len(report.flagged)} flagged jobs) to "
              f"{', '.join(plan.recipients)}")
    if file_error is not None:
        raise file_error
    return 0
