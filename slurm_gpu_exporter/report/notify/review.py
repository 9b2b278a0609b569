"""The weekly review for admins: the low-util report as one mail (plain text and the
HTML page with its charts) and as a dated file.

The recipients are the site's (``--report-to``), checked here once: plain addresses,
nothing that could add another recipient or a header. User text (job, user, account
names) reaches the mail only through the renderers, which make it inert; the header
lines hold none of it and still go through ``plain``.
"""

from __future__ import annotations

import re
import socket
from datetime import UTC, datetime
from email.message import EmailMessage
from email.utils import formatdate, make_msgid

from slurm_gpu_exporter.report.errors import ReportError
from slurm_gpu_exporter.report.figures.shapes import LowUtilReport
from slurm_gpu_exporter.report.inert_text import plain
from slurm_gpu_exporter.report.render.html import low_util_html
from slurm_gpu_exporter.report.render.text import low_util_table
from slurm_gpu_exporter.report.render.values import when

# A plain addr-spec: a dot-atom local part of the common characters (RFC 5322 allows
# more, quotes among them; no admins' list needs them) and a host name. No display
# names, quotes, comments, route or group syntax: nothing that can name a second
# recipient or break a header.
_LOCAL = r"[A-Za-z0-9_%+-]+(?:\.[A-Za-z0-9_%+-]+)*"
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_DOMAIN = rf"{_LABEL}(?:\.{_LABEL})*"
ADDRESS = re.compile(f"{_LOCAL}@{_DOMAIN}")
MAX_ADDRESS = 254  # RFC 5321's limit on a forward path
MAX_RECIPIENTS = 50
# What a --cluster value keeps in a file name.
_NAME_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")
TEXT_WIDTH = 110


def parse_recipients(text: str) -> tuple[str, ...]:
    """``a@example.org,b@example.org`` as a tuple of addresses, each once, in order.
    ReportError (exit 2) naming the first address that is not a plain one."""
    found: list[str] = []
    for part in text.split(","):
        address = part.strip(" ")  # spaces after commas; any other blank is refused
        if not address:
            continue
        if len(address) > MAX_ADDRESS or not ADDRESS.fullmatch(address):
            raise ReportError(f"bad --report-to address {plain(address)!r}: give plain "
                              "addresses such as gpu-admins@example.org, separated by commas")
        if address not in found:
            found.append(address)
    if not found:
        raise ReportError("--report-to names no address: give one or more, separated by "
                          "commas")
    if len(found) > MAX_RECIPIENTS:
        raise ReportError(f"--report-to names {len(found)} addresses (at most "
                          f"{MAX_RECIPIENTS}): send to a mailing list instead")
    return tuple(found)


def review_subject(report: LowUtilReport) -> str:
    """One line: how many jobs, the threshold and the window."""
    return plain(f"GPU review: {len(report.flagged)} of {report.jobs_seen} jobs under "
                 f"{report.threshold:.0%} busy, {when(report.window.start)} - "
                 f"{when(report.window.end)}")


def review_file_name(report: LowUtilReport, cluster: str | None = None) -> str:
    """``low-util-[CLUSTER-]YYYY-MM-DD.html``, dated by the window's end (UTC, as the
    report prints times): one file per review, a rerun the same day replaces it."""
    day = datetime.fromtimestamp(report.window.end, UTC).strftime("%Y-%m-%d")
    site = f"{_NAME_UNSAFE.sub('_', cluster)[:64]}-" if cluster else ""
    return f"low-util-{site}{day}.html"


def review_html(report: LowUtilReport) -> str:
    """The page mailed and written: the HTML report, charts inline (SVG)."""
    return low_util_html(report)


def review_message(report: LowUtilReport, recipients: tuple[str, ...], sender: str,
                   html: str | None = None) -> EmailMessage:
    """multipart/alternative: the report as a plain-text table, then as HTML."""
    mail = EmailMessage()
    try:
        mail["From"] = plain(sender)
        mail["To"] = ", ".join(plain(r) for r in recipients)
        mail["Subject"] = review_subject(report)
    except ValueError as exc:
        raise ReportError(f"cannot make the review mail: {exc}") from None
    mail["Date"] = formatdate(localtime=False, usegmt=True)
    mail["Message-ID"] = make_msgid(domain=socket.gethostname() or None)
    mail["Auto-Submitted"] = "auto-generated"  # RFC 3834: no vacation replies
    mail.set_content(low_util_table(report, width=TEXT_WIDTH, color=False))
    mail.add_alternative(html if html is not None else review_html(report), subtype="html")
    return mail
