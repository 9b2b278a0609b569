"""A site's mail relay as sites run one: STARTTLS, its certificate checked against the
system CAs or a CA file, then SMTP AUTH with a user and a password read from a file.

Credentials go only over a connection that upgraded: a server that does not offer
STARTTLS, or whose certificate does not verify, gets no AUTH and no mail. The password
is never put in a message, a log line or a repr; errors name the file, not its content.
"""

from __future__ import annotations

import smtplib
import ssl
from dataclasses import dataclass, field

from slurm_gpu_exporter.report.errors import ReportError
from slurm_gpu_exporter.report.inert_text import plain

# A password file holds one password, not a document.
MAX_PASSWORD_BYTES = 4096


@dataclass(frozen=True)
class RelayLogin:
    """How to talk to the relay beyond plain SMTP: STARTTLS (with ``ca_file``, else the
    system CAs) and AUTH as ``user``."""

    starttls: bool = False
    ca_file: str | None = None
    user: str | None = None
    password: str | None = field(default=None, repr=False)


PLAIN_SMTP = RelayLogin()


def read_password_file(path: str) -> str:
    """The password in ``path``: its text less one trailing newline. ReportError (exit
    2) naming the file when it cannot be read, is empty or holds what SMTP AUTH cannot
    carry."""
    try:
        with open(path, "rb") as file:
            raw = file.read(MAX_PASSWORD_BYTES + 1)
    except OSError as exc:
        raise ReportError(f"cannot read the SMTP password file {path}: {exc.strerror}; "
                          "give --smtp-password-file a file this user can read") from None
    if len(raw) > MAX_PASSWORD_BYTES:
        raise ReportError(f"the SMTP password file {path} is over {MAX_PASSWORD_BYTES} "
                          "bytes: it should hold the password alone")
    raw = raw[:-2] if raw.endswith(b"\r\n") else raw[:-1] if raw.endswith(b"\n") else raw
    # smtplib sends AUTH in ASCII; a NUL or a line break would end the field early.
    if not raw or not raw.isascii() or any(byte < 0x20 or byte == 0x7F for byte in raw):
        why = "is empty" if not raw else "holds more than one line of printable ASCII"
        raise ReportError(f"the SMTP password file {path} {why}: put the password alone "
                          "in it, one line")
    return raw.decode("ascii")


def relay_login(starttls: bool, ca_file: str | None, user: str | None,
                password_file: str | None) -> RelayLogin:
    """The login the ``--smtp-*`` flags ask for, checked, its password read (before any
    query: a missing file fails at once). ReportError (exit 2) for a combination that
    would send a password in clear or leave one unused."""
    if ca_file is not None and not starttls:
        raise ReportError("--smtp-ca-file checks the server's STARTTLS certificate: add "
                          "--smtp-starttls")
    if (user is None) != (password_file is None):
        raise ReportError("SMTP AUTH needs both --smtp-user and --smtp-password-file")
    if user is not None and not starttls:
        raise ReportError("--smtp-user sends a password: add --smtp-starttls, so that it "
                          "goes only over an encrypted connection")
    if user is not None and (not user or not user.isprintable() or not user.isascii()):
        raise ReportError(f"bad --smtp-user {plain(user)!r}: give the relay's user name")
    if ca_file is not None:
        try:
            ssl.create_default_context(cafile=ca_file)
        except (OSError, ssl.SSLError) as exc:
            raise ReportError(f"cannot use --smtp-ca-file {ca_file}: "
                              f"{getattr(exc, 'strerror', None) or plain(exc)}") from None
    password = read_password_file(password_file) if password_file is not None else None
    return RelayLogin(starttls=starttls, ca_file=ca_file, user=user, password=password)


def tls_context(login: RelayLogin) -> ssl.SSLContext:
    """Certificate and host name checked: against ``ca_file`` alone when given, else
    the system's CAs."""
    return ssl.create_default_context(cafile=login.ca_file)


def secure(smtp: smtplib.SMTP, login: RelayLogin, where: str, exit_code: int) -> None:
    """STARTTLS, then AUTH, as ``login`` asks, on a connected ``smtp``. ReportError
    with ``exit_code`` when the server cannot do it; nothing secret is sent before the
    connection is encrypted and the certificate verified."""
    if login.starttls:
        smtp.ehlo()
        if not smtp.has_extn("starttls"):
            raise ReportError(f"the mail server {where} does not offer STARTTLS, which "
                              "--smtp-starttls requires: nothing was sent (no credentials "
                              "either); check the server and port (submission is 587)",
                              exit_code)
        try:
            smtp.starttls(context=tls_context(login))
        except ssl.SSLCertVerificationError as exc:
            raise ReportError(f"the mail server {where}'s certificate does not verify "
                              f"({plain(exc.verify_message)}): nothing was sent; give its "
                              "CA with --smtp-ca-file", exit_code) from None
        smtp.ehlo()
    if login.user is None:
        return
    if not login.starttls or not isinstance(smtp.sock, ssl.SSLSocket):
        raise ReportError(f"not logging in to {where}: the connection is not encrypted",
                          exit_code)
    try:
        smtp.login(login.user, login.password or "")
    except smtplib.SMTPAuthenticationError as exc:
        raise ReportError(f"the mail server {where} refused the login of "
                          f"{plain(login.user)!r} ({exc.smtp_code} "
                          f"{plain(_text(exc.smtp_error))}): check --smtp-user and the "
                          "password file", exit_code) from None


def _text(reply: bytes | str) -> str:
    return reply.decode(errors="replace") if isinstance(reply, bytes) else reply
