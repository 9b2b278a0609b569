"""The wrapper's settings: a small TOML file, every key optional. A wrong key never
costs the others: each bad key falls back to its own default, alone, and is reported
(the wrapper logs it; ``slurm-gpu-mail --check`` lists it)."""

from __future__ import annotations

import difflib
import os
import re
import sys
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from slurm_gpu_exporter.mail.budget import (
    DEFAULT_MAILER_TIMEOUT_S,
    DEFAULT_SUMMARY_TIMEOUT_S,
    MAX_MAILER_TIMEOUT_S,
    MAX_SUMMARY_TIMEOUT_S,
    TOTAL_BUDGET_S,
    fit_summary,
)

DEFAULT_CONFIG = Path("/etc/slurm-gpu-report/mail.toml")
CONFIG_ENV = "SLURM_GPU_MAIL_CONFIG"
# Also the mailer when the configured one is no absolute path: it is slurm.conf's own
# default MailProg, on most systems, and a mail sent there beats a mail surely lost.
DEFAULT_MAILER = "/usr/bin/mail"
# After a TOML syntax error only this line shape is read back: a top-level mailer (before
# any [table]) as a plain double-quoted absolute path, nothing but a comment after it.
SALVAGED_MAILER = re.compile(r'[ \t]*mailer[ \t]*=[ \t]*"(/[^"\\\x00-\x1f]*)"[ \t]*(?:#.*)?')
TABLE_HEADER = re.compile(r"[ \t]*\[")
# A key is written back in log lines: a quoted TOML key may hold a newline.
UNPRINTABLE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def _default_report() -> str:
    """slurm-gpu-report from the same installation as this script (slurmctld runs
    MailProg without PATH)."""
    return str(Path(sys.executable).parent / "slurm-gpu-report")


@dataclass(frozen=True)
class MailConfig:
    mailer: str = DEFAULT_MAILER
    report: str = field(default_factory=_default_report)
    prometheus_url: str | None = None  # None: the report's own default
    report_args: tuple[str, ...] = ()  # more flags for the report (--ca-file …)
    summary_timeout_s: float = DEFAULT_SUMMARY_TIMEOUT_S
    mailer_timeout_s: float = DEFAULT_MAILER_TIMEOUT_S
    log_file: Path | None = None


@dataclass(frozen=True)
class ConfigProblem:
    """One thing wrong in the file: the key ("" for the file as a whole) and what
    was done about it."""
    key: str
    message: str

    def line(self, path: Path) -> str:
        key = UNPRINTABLE.sub("?", self.key[:100])
        return f"{path}: {key}: {self.message}" if key else f"{path}: {self.message}"


@dataclass(frozen=True)
class LoadedConfig:
    config: MailConfig
    problems: tuple[ConfigProblem, ...] = ()
    found: bool = True  # False: no file, the defaults


def config_path() -> Path:
    return Path(os.environ.get(CONFIG_ENV) or DEFAULT_CONFIG)


def _text(value: object) -> str:
    if not isinstance(value, str):
        raise ValueError("must be a string")
    return value


def _absolute(value: object) -> str:
    text = _text(value)
    if not text.startswith("/") or "\x00" in text:
        raise ValueError("must be an absolute path (slurmctld gives MailProg no PATH)")
    return text


def _strings(value: object) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise ValueError("must be a list of strings")
    return tuple(value)


def _seconds(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ValueError("must be a number of seconds, more than 0")
    return float(value)


# Over these, a time is clamped (with a problem), not dropped to its default.
MOST_SECONDS = {"summary_timeout_seconds": MAX_SUMMARY_TIMEOUT_S,
                "mailer_timeout_seconds": MAX_MAILER_TIMEOUT_S}


# key in the file -> (MailConfig field, parser)
KEYS: dict[str, tuple[str, Callable[[object], Any]]] = {
    "mailer": ("mailer", _absolute),
    "report": ("report", _absolute),
    "prometheus_url": ("prometheus_url", _text),
    "report_args": ("report_args", _strings),
    "summary_timeout_seconds": ("summary_timeout_s", _seconds),
    "mailer_timeout_seconds": ("mailer_timeout_s", _seconds),
    "log_file": ("log_file", lambda value: Path(_absolute(value))),
}


def unknown_key_problem(key: str) -> ConfigProblem:
    near = difflib.get_close_matches(key, KEYS, n=1, cutoff=0.6)
    hint = f"did you mean {near[0]!r}?" if near else f"known: {', '.join(sorted(KEYS))}"
    return ConfigProblem(key, f"unknown key, ignored ({hint})")


def settings_from(data: dict[str, Any]) -> tuple[MailConfig, list[ConfigProblem]]:
    """The config that ``data`` (a parsed file) gives: each bad key at its default."""
    values: dict[str, Any] = {}
    problems: list[ConfigProblem] = []
    for key, value in data.items():
        if key not in KEYS:
            problems.append(unknown_key_problem(key))
            continue
        name, parse = KEYS[key]
        try:
            parsed = parse(value)
        except ValueError as exc:
            default = f" ({DEFAULT_MAILER})" if key == "mailer" else ""
            problems.append(ConfigProblem(key, f"{exc}; the default{default} is used"))
            continue
        most = MOST_SECONDS.get(key)
        if most is not None and parsed > most:
            problems.append(ConfigProblem(key, f"{parsed:g} is over the most, {most:g} s; "
                                               f"{most:g} is used"))
            parsed = most
        values[name] = parsed
    config = replace(MailConfig(), **values)
    # The summary gives way, so that the mailer keeps its time (budget.py).
    fitted = fit_summary(config.summary_timeout_s, config.mailer_timeout_s)
    if fitted < config.summary_timeout_s:
        problems.append(ConfigProblem(
            "summary_timeout_seconds",
            f"{config.summary_timeout_s:g} + mailer_timeout_seconds "
            f"{config.mailer_timeout_s:g} is over the {TOTAL_BUDGET_S:g} s both share inside "
            f"slurmctld's 120 s; the summary gets {fitted:g}"))
        config = replace(config, summary_timeout_s=fitted)
    return config, problems


def salvage_mailer(text: str) -> str | None:
    """The mailer of a file that is not valid TOML, when exactly one top-level line sets
    it in the plain form (``SALVAGED_MAILER``); None otherwise."""
    found = []
    for line in text.splitlines():
        if TABLE_HEADER.match(line):
            break  # past the top level: a `mailer` here belongs to a table
        match = SALVAGED_MAILER.fullmatch(line)
        if match:
            found.append(match.group(1))
    return found[0] if len(found) == 1 else None


def load_mail_config(path: Path) -> LoadedConfig:
    """The settings in ``path`` and what is wrong there; the defaults when it does not
    exist. Never raises for what the file holds."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return LoadedConfig(MailConfig(), found=False)
    except OSError as exc:
        return LoadedConfig(MailConfig(), (ConfigProblem(
            "", f"cannot be read ({exc.strerror}); every setting is at its default"),))
    try:
        data = tomllib.loads(raw.decode())
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:  # TOMLDecodeError
        why = "not UTF-8" if isinstance(exc, UnicodeDecodeError) else str(exc)[:200]
        mailer = salvage_mailer(raw.decode(errors="replace"))
        kept = (f"mailer {mailer} read from its line, every other setting at its default"
                if mailer else "every setting at its default")
        return LoadedConfig(MailConfig(mailer=mailer or DEFAULT_MAILER), (ConfigProblem(
            "", f"not valid TOML ({why}); {kept}"),))
    config, problems = settings_from(data)
    return LoadedConfig(config, tuple(problems))
