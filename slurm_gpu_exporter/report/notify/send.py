"""Delivering one message to a user: SMTP (``smtp://host[:port]``, with STARTTLS and AUTH
where the site's relay wants them: relay.py) or an http(s) webhook.

The message's text is made by whoever sends it (the low-util notices, enforce's
warnings), always through ``make_message``: the one recipient check (a user name that
could name other recipients gets no message) and the one inert-text function for the
header lines. A failure is a ReportError with ``EXIT_NOTIFY``.
"""

from __future__ import annotations

import json
import smtplib
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from email.message import EmailMessage

from slurm_gpu_exporter.model.users import is_mailable_user
from slurm_gpu_exporter.report.errors import ReportError
from slurm_gpu_exporter.report.figures.rules import render_template
from slurm_gpu_exporter.report.inert_text import plain
from slurm_gpu_exporter.report.notify.relay import PLAIN_SMTP, RelayLogin, secure

EXIT_NOTIFY = 6
SEND_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Message:
    user: str
    to: str
    subject: str
    text: str
    jobids: tuple[str, ...]


def make_message(user: str, to_template: str, subject: str, text: str,
                 jobids: tuple[str, ...]) -> Message:
    """A message to ``user``: the recipient from ``to_template`` (``{user}@example.org``),
    the subject made one plain line. ReportError (``EXIT_NOTIFY``) when the user's name
    cannot stand in a mail address safely."""
    if not is_mailable_user(user):  # could name other recipients
        raise ReportError(f"not writing to the user {plain(user)!r}: the name cannot stand "
                          "in a mail address safely; tell them another way", EXIT_NOTIFY)
    return Message(user=user, to=plain(render_template(to_template, {"user": user})),
                   subject=plain(subject), text=text, jobids=jobids)


def send(message: Message, target: str, sender: str, login: RelayLogin = PLAIN_SMTP) -> None:
    """Deliver one message: ``smtp://host[:port]`` (as ``login`` says: STARTTLS, AUTH)
    or an ``http(s)://`` webhook."""
    url = urllib.parse.urlsplit(target)
    if url.scheme == "smtp":
        _send_smtp(message, target, sender, login)
    elif url.scheme in ("http", "https"):
        _send_webhook(message, target)
    else:
        raise ReportError(f"bad --notify {target!r}: use smtp://host[:port] or an http(s) "
                          "webhook URL")


def smtp_server(target: str, flag: str = "--smtp") -> tuple[str, int]:
    """Host and port of ``smtp://host[:port]`` (localhost and 25 when not given);
    ReportError naming ``flag`` for another scheme or a port that is not one."""
    url = urllib.parse.urlsplit(target)
    try:
        port = url.port or 25
    except ValueError:
        port = 0
    if url.scheme != "smtp" or not port:
        raise ReportError(f"bad {flag} {target!r}: use smtp://host[:port]")
    return url.hostname or "localhost", port


def send_mail(mail: EmailMessage, server: tuple[str, int], recipients: tuple[str, ...],
              login: RelayLogin = PLAIN_SMTP) -> None:
    """Hand ``mail`` to the SMTP ``server`` (host, port: ``smtp_server``) for
    ``recipients`` (the envelope: exactly these, whatever the headers say), after
    STARTTLS and AUTH where ``login`` asks for them. ReportError (``EXIT_NOTIFY``) when
    the server cannot be reached, cannot be trusted or refuses it."""
    host, port = server
    to = ", ".join(plain(r) for r in recipients)
    try:
        with smtplib.SMTP(host, port, timeout=SEND_TIMEOUT_S) as smtp:
            secure(smtp, login, f"{host}:{port}", EXIT_NOTIFY)
            smtp.send_message(mail, to_addrs=list(recipients))
    except (OSError, smtplib.SMTPException) as exc:
        raise ReportError(f"cannot send mail to {to} through {host}:{port}: {plain(exc)}",
                          EXIT_NOTIFY) from None


def _send_smtp(message: Message, target: str, sender: str, login: RelayLogin) -> None:
    mail = EmailMessage()
    try:
        # Header lines are plain already; a value the email package still refuses
        # is this message's failure, never the run's.
        mail["From"], mail["To"] = plain(sender), plain(message.to)
        mail["Subject"] = plain(message.subject)
    except ValueError as exc:
        raise ReportError(f"cannot make a mail to {plain(message.to)}: {exc}",
                          EXIT_NOTIFY) from None
    mail.set_content(message.text)
    send_mail(mail, smtp_server(target, "--notify"), (message.to,), login)


def _send_webhook(message: Message, url: str) -> None:
    body = json.dumps({"user": message.user, "to": message.to, "subject": message.subject,
                       "text": message.text, "jobs": list(message.jobids)}).encode()
    request = urllib.request.Request(url, data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=SEND_TIMEOUT_S) as resp:
            resp.read()
    except (OSError, urllib.error.URLError) as exc:
        raise ReportError(f"the webhook {url} failed for {plain(message.user)}: {plain(exc)}",
                          EXIT_NOTIFY) from None


def dry_run_text(message: Message) -> str:
    return f"To: {message.to}\nSubject: {message.subject}\n\n{message.text}"
