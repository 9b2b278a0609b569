"""The login of one run: the ``--smtp-*`` flags over the ``[notify]`` keys
(``report/relay_settings.py``), checked by ``relay.relay_login``."""

from __future__ import annotations

import argparse
import urllib.parse

from slurm_gpu_exporter.report.errors import ReportError
from slurm_gpu_exporter.report.notify.relay import PLAIN_SMTP, RelayLogin, relay_login
from slurm_gpu_exporter.report.relay_settings import KEYS, RelaySettings


def login_for(args: argparse.Namespace, settings: RelaySettings, mails_by_smtp: bool,
              dry_run: bool = False) -> RelayLogin:
    """The login for this run: each ``--smtp-*`` flag given wins over its key, checked
    and the password file read (before any query). Plain SMTP when neither says
    anything, or for a dry run, which sends nothing. ReportError (exit 2) when login
    flags come without mail through SMTP (``mails_by_smtp``): a config's keys then
    simply do not apply."""
    # Each key is its flag's argparse name (smtp_ca_file is --smtp-ca-file).
    flags = [flag for key, (flag, _) in KEYS.items() if getattr(args, key)]
    if dry_run:
        return PLAIN_SMTP
    if flags and not mails_by_smtp:
        raise ReportError(f"{flags[0]} is for mail through an SMTP server: add --report-to "
                          "ADDR[,ADDR…] or --notify smtp://host[:port]")
    if not mails_by_smtp:
        return PLAIN_SMTP
    return relay_login(args.smtp_starttls or settings.starttls,
                       args.smtp_ca_file or settings.ca_file,
                       args.smtp_user or settings.user,
                       args.smtp_password_file or settings.password_file)


def sends_smtp(target: str | None) -> bool:
    """Whether a ``--notify`` target is a mail server."""
    return urllib.parse.urlsplit(target or "").scheme == "smtp"
