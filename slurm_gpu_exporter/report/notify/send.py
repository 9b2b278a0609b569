"""Delivering one message to a user: SMTP (``smtp://host[:port]``) or an http(s) webhook.

The message's text is made by whoever sends it (the low-util notices, enforce's
warnings); a failure is a ReportError with ``EXIT_NOTIFY``.
"""

from __future__ import annotations

import json
import smtplib
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from email.message import EmailMessage

from slurm_gpu_exporter.report.errors import ReportError

EXIT_NOTIFY = 6
SEND_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Message:
    user: str
    to: str
    subject: str
    text: str
    jobids: tuple[str, ...]


def send(message: Message, target: str, sender: str) -> None:
    """Deliver one message: ``smtp://host[:port]`` or an ``http(s)://`` webhook."""
    url = urllib.parse.urlsplit(target)
    if url.scheme == "smtp":
        _send_smtp(message, url.hostname or "localhost", url.port or 25, sender)
    elif url.scheme in ("http", "https"):
        _send_webhook(message, target)
    else:
        raise ReportError(f"bad --notify {target!r}: use smtp://host[:port] or an http(s) "
                          "webhook URL")


def _send_smtp(message: Message, host: str, port: int, sender: str) -> None:
    mail = EmailMessage()
    mail["From"], mail["To"], mail["Subject"] = sender, message.to, message.subject
    mail.set_content(message.text)
    try:
        with smtplib.SMTP(host, port, timeout=SEND_TIMEOUT_S) as smtp:
            smtp.send_message(mail)
    except (OSError, smtplib.SMTPException) as exc:
        raise ReportError(f"cannot send mail to {message.to} through {host}:{port}: {exc}",
                          EXIT_NOTIFY) from None


def _send_webhook(message: Message, url: str) -> None:
    body = json.dumps({"user": message.user, "to": message.to, "subject": message.subject,
                       "text": message.text, "jobs": list(message.jobids)}).encode()
    request = urllib.request.Request(url, data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=SEND_TIMEOUT_S) as resp:
            resp.read()
    except (OSError, urllib.error.URLError) as exc:
        raise ReportError(f"the webhook {url} failed for {message.user}: {exc}",
                          EXIT_NOTIFY) from None


def dry_run_text(message: Message) -> str:
    return f"To: {message.to}\nSubject: {message.subject}\n\n{message.text}"
