"""The site's enforcement policy for ``slurm-gpu-report enforce``: TOML, checked whole.

A policy that is wrong in any way (unknown key, wrong type, a cancel time below a
warning time, a bad pattern) is refused with one line naming the key, before any
query is made, so a typo can never turn into cancelled jobs.
"""

from __future__ import annotations

import fnmatch
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slurm_gpu_exporter.report.errors import ReportError
from slurm_gpu_exporter.report.figures.rules import render_template
from slurm_gpu_exporter.report.relay_settings import KEYS as RELAY_KEYS
from slurm_gpu_exporter.report.relay_settings import (
    NO_SETTINGS,
    RelaySettings,
    parse_relay_settings,
)

_DURATION_RE = re.compile(r"(\d+(?:\.\d+)?)(s|m|h|d)")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
# What a message template may name (checked when the policy is read).
MESSAGE_FACTS = {
    "jobid": "1234", "name": "train", "user": "ann", "account": "lab", "partition": "gpu",
    "gpus": 2, "nodes": "gpu01", "idle_for": "1h00m", "cancel_after": "2h00m",
    "cancel_at": "2026-01-01 12:00 UTC", "warning": 1, "warnings": 2,
    "busy_fraction": 0.01,
}

DEFAULT_POLICY = '''\
# slurm-gpu-report enforce policy. Durations are strings with a unit: 90s, 15m, 2h, 1d.
# Every key is optional; an unknown key is an error (so a typo cannot pass unnoticed).

[idle]
# A GPU is idle in a window when its busy seconds grew by less than this share of its
# allocated seconds there; a job is idle when all its GPUs, on all its nodes, are.
busy_fraction = 0.01
# How long a job has been idle (a window ending now) at each warning, in order.
warn_after = ["60m", "90m"]
# Idle time at which the job is cancelled: after every warning was sent, and not
# sooner after the last warning than the gap between it and cancel_after.
cancel_after = "120m"
# Jobs younger than this are left alone.
min_job_age = "30m"
# At most this many jobs are cancelled in one run; the rest wait for the next run.
max_cancels_per_run = 10

[exempt]
# Jobs never warned nor cancelled. job_names are glob patterns (* ? [abc]). Users
# name their own jobs (sbatch --job-name): a job-name exemption is one any user can
# claim. Exempt by account, partition or QOS where that matters.
users = []
accounts = []
partitions = []
qos = []
job_names = []

[messages]
# Templates over: {jobid} {name} {user} {account} {partition} {gpus} {nodes}
# {idle_for} {cancel_after} {cancel_at} {warning} {warnings} {busy_fraction}.
# {jobid} is what the user would scancel: 1234_5 for an array task, the leader's id
# for a het job.
warning_subject = "Job {jobid}: its GPUs are idle (warning {warning} of {warnings})"
warning = """
Hello {user},

your job {jobid} ({name}) holds {gpus} GPU(s) on {nodes}, and they have been idle
(busy less than {busy_fraction:.0%} of the time) for at least {idle_for}.

If they stay idle, the job will be cancelled at about {cancel_at}. Please cancel it
yourself if it no longer needs the GPUs (scancel {jobid}), or fix it so that it uses them.
If the job has to hold idle GPUs, ask hpc-help@example.org for an exemption.
"""
cancel_subject = "Job {jobid} was cancelled: its GPUs were idle for {idle_for}"
cancel = """
Hello {user},

your job {jobid} ({name}) was cancelled: its {gpus} GPU(s) on {nodes} were idle for
at least {idle_for}, after {warnings} warning(s). Others were waiting for them.
If this was wrong, or your jobs need an exemption, write to hpc-help@example.org.
"""

[notify]
# The mail relay's login for --notify smtp:// (each --smtp-* flag wins over its key):
# STARTTLS with the server's certificate checked (system CAs, or this CA file), then
# SMTP AUTH with the password in that file (never the password here).
smtp_starttls = false
smtp_ca_file = ""
smtp_user = ""
smtp_password_file = ""
'''

_SCHEMA: dict[str, dict[str, type | tuple[type, ...]]] = {
    "idle": {"busy_fraction": (int, float), "warn_after": list, "cancel_after": str,
             "min_job_age": str, "max_cancels_per_run": int},
    "exempt": {"users": list, "accounts": list, "partitions": list, "qos": list,
               "job_names": list},
    "messages": {"warning_subject": str, "warning": str, "cancel_subject": str, "cancel": str},
    # the mail relay's login for --notify smtp:// (relay_settings checks the values)
    "notify": {key: kind for key, (_, kind) in RELAY_KEYS.items()},
}


@dataclass(frozen=True)
class Exemptions:
    users: frozenset[str] = frozenset()
    accounts: frozenset[str] = frozenset()
    partitions: frozenset[str] = frozenset()
    qos: frozenset[str] = frozenset()
    job_names: tuple[str, ...] = ()

    def reason(self, user: str, account: str, partition: str, qos: str,
               name: str) -> str | None:
        """Why a job is exempt ("user ann"), or None when it is not."""
        for kind, value, listed in (("user", user, self.users),
                                    ("account", account, self.accounts),
                                    ("qos", qos, self.qos)):
            if value and value in listed:
                return f"{kind} {value}"
        # A job may span partitions: "gpu,gpu-long".
        for part in filter(None, partition.split(",")):
            if part in self.partitions:
                return f"partition {part}"
        for pattern in self.job_names:
            if fnmatch.fnmatchcase(name, pattern):
                return f"job name matches {pattern!r}"
        return None


@dataclass(frozen=True)
class Policy:
    busy_fraction: float
    warn_after_s: tuple[float, ...]
    cancel_after_s: float
    min_job_age_s: float
    max_cancels_per_run: int
    exempt: Exemptions
    warning_subject: str
    warning: str
    cancel_subject: str
    cancel: str
    relay: RelaySettings = NO_SETTINGS  # [notify] smtp_*, under the --smtp-* flags

    @property
    def windows_s(self) -> tuple[float, ...]:
        """Every idle window the decisions look at, shortest first."""
        return tuple(sorted({*self.warn_after_s, self.cancel_after_s}))


def span(seconds: float) -> str:
    """A policy duration as people write it: ``90s``, ``15m``, ``2h``, ``1h30m``."""
    seconds = round(seconds)
    if seconds < 120 and seconds % 60:
        return f"{seconds}s"
    hours, minutes = divmod(seconds // 60, 60)
    if not hours:
        return f"{minutes}m"
    return f"{hours}h{minutes:02d}m" if minutes else f"{hours}h"


def parse_policy_duration(text: object, key: str) -> float:
    """``90s``, ``15m``, ``2h``, ``1h30m`` -> seconds; ReportError naming ``key``."""
    if not isinstance(text, str):
        raise ReportError(f"bad policy: {key} must be a string with a unit, e.g. \"90m\"")
    parts = _DURATION_RE.findall(text.strip())
    if not parts or "".join(n + u for n, u in parts) != text.strip():
        raise ReportError(f"bad policy: {key} = {text!r} is not a duration; use a number and "
                          "a unit (s, m, h, d), e.g. \"90m\"")
    return sum(float(n) * _UNITS[u] for n, u in parts)


def _strings(values: list[Any], key: str) -> tuple[str, ...]:
    if not all(isinstance(v, str) and v for v in values):
        raise ReportError(f"bad policy: {key} must be a list of non-empty strings")
    return tuple(values)


def _check_pattern(pattern: str, key: str) -> None:
    # fnmatch accepts anything; an unclosed class is almost surely a typo.
    if pattern.count("[") != pattern.count("]"):
        raise ReportError(f"bad policy: {key} has the bad pattern {pattern!r} "
                          "(unbalanced [ ]); use * ? and [abc]")
    try:
        re.compile(fnmatch.translate(pattern))
    except re.error as exc:
        raise ReportError(f"bad policy: {key} has the bad pattern {pattern!r} ({exc})") from None


def _check_shape(data: dict[str, Any]) -> None:
    for section, value in data.items():
        if section not in _SCHEMA:
            raise ReportError(f"bad policy: unknown section [{section}]; known: "
                              f"{', '.join(_SCHEMA)}")
        if not isinstance(value, dict):
            raise ReportError(f"bad policy: {section} must be a table ([{section}])")
        for key, item in value.items():
            wanted = _SCHEMA[section].get(key)
            if wanted is None:
                raise ReportError(f"bad policy: unknown key {section}.{key}; known: "
                                  f"{', '.join(_SCHEMA[section])}")
            if not isinstance(item, wanted) or (isinstance(item, bool) and wanted is not bool):
                raise ReportError(f"bad policy: {section}.{key} has the wrong type "
                                  f"({type(item).__name__})")


def parse_policy(text: str, where: str = "the policy") -> Policy:
    """A checked Policy from TOML text, over the defaults; ReportError (exit 2) naming the key."""
    try:
        site = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ReportError(f"bad TOML in {where}: {exc}") from None
    _check_shape(site)
    data = tomllib.loads(DEFAULT_POLICY)
    for section, values in site.items():
        data[section] = {**data[section], **values}
    idle, exempt, messages = data["idle"], data["exempt"], data["messages"]

    fraction = float(idle["busy_fraction"])
    if not 0 < fraction < 1:
        raise ReportError("bad policy: idle.busy_fraction must be between 0 and 1, e.g. 0.01")
    warn_after = tuple(parse_policy_duration(v, "idle.warn_after") for v in idle["warn_after"])
    if list(warn_after) != sorted(set(warn_after)):
        raise ReportError("bad policy: idle.warn_after must grow: each warning after the one "
                          "before")
    cancel_after = parse_policy_duration(idle["cancel_after"], "idle.cancel_after")
    if warn_after and cancel_after <= warn_after[-1]:
        raise ReportError("bad policy: idle.cancel_after must be later than the last "
                          "idle.warn_after, so that users are warned before a cancel")
    min_age = parse_policy_duration(idle["min_job_age"], "idle.min_job_age")
    if cancel_after <= 0 or min_age < 0 or (warn_after and warn_after[0] <= 0):
        raise ReportError("bad policy: idle.warn_after and idle.cancel_after must be longer "
                          "than 0 s")
    cap = idle["max_cancels_per_run"]
    if cap < 0:
        raise ReportError("bad policy: idle.max_cancels_per_run must be 0 or more")
    names = _strings(exempt["job_names"], "exempt.job_names")
    for pattern in names:
        _check_pattern(pattern, "exempt.job_names")
    exemptions = Exemptions(
        users=frozenset(_strings(exempt["users"], "exempt.users")),
        accounts=frozenset(_strings(exempt["accounts"], "exempt.accounts")),
        partitions=frozenset(_strings(exempt["partitions"], "exempt.partitions")),
        qos=frozenset(_strings(exempt["qos"], "exempt.qos")), job_names=names)
    for key, template in messages.items():
        try:
            render_template(template, MESSAGE_FACTS)
        except ReportError as exc:
            raise ReportError(f"bad policy: messages.{key}: {exc}") from None
    return Policy(busy_fraction=fraction, warn_after_s=warn_after, cancel_after_s=cancel_after,
                  min_job_age_s=min_age, max_cancels_per_run=cap, exempt=exemptions,
                  warning_subject=messages["warning_subject"], warning=messages["warning"],
                  cancel_subject=messages["cancel_subject"], cancel=messages["cancel"],
                  relay=parse_relay_settings(data["notify"], where))


def load_policy(path: str) -> Policy:
    """The policy file at ``path`` (see :func:`parse_policy`)."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ReportError(f"cannot read the policy {path}: {exc.strerror}; check --policy") \
            from None
    return parse_policy(text, path)
