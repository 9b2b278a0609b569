"""The mail relay's login as a site writes it once: the ``smtp_*`` keys of a ``[notify]``
section (the report's ``--config``, enforce's ``--policy``), each overridden by its
``--smtp-*`` flag on the command line (``notify/run_login.py``). Here, below the
config parsers: the keys and their checked values, nothing of mail.

A timer unit then carries no login flags, and the password stays in its own file
(``smtp_password_file``): a config file names the file, never the password.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from slurm_gpu_exporter.report.errors import ReportError

# key in [notify] -> (its flag, the type its value must have)
KEYS: dict[str, tuple[str, type]] = {
    "smtp_starttls": ("--smtp-starttls", bool),
    "smtp_ca_file": ("--smtp-ca-file", str),
    "smtp_user": ("--smtp-user", str),
    "smtp_password_file": ("--smtp-password-file", str),
}


@dataclass(frozen=True)
class RelaySettings:
    """What a ``[notify]`` section says of the relay; False/None where it says nothing."""

    starttls: bool = False
    ca_file: str | None = None
    user: str | None = None
    password_file: str | None = None


NO_SETTINGS = RelaySettings()


def parse_relay_settings(section: dict[str, Any], where: str) -> RelaySettings:
    """The ``smtp_*`` keys of a ``[notify]`` section (other keys are the caller's).
    ReportError (exit 2) naming the key for a value of the wrong type; an empty string
    is a key not set."""
    values: dict[str, Any] = {}
    for key, (_, kind) in KEYS.items():
        value = section.get(key)
        if value is None:
            continue
        if not isinstance(value, kind):
            raise ReportError(f"bad configuration in {where}: notify.{key} must be a "
                              f"{'boolean' if kind is bool else 'string'}")
        values[key] = value if kind is bool else (value or None)
    return RelaySettings(starttls=values.get("smtp_starttls", False),
                         ca_file=values.get("smtp_ca_file"), user=values.get("smtp_user"),
                         password_file=values.get("smtp_password_file"))
