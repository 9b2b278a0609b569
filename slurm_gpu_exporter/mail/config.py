"""The wrapper's settings: a small TOML file, every key optional."""

from __future__ import annotations

import os
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_CONFIG = Path("/etc/slurm-gpu-report/mail.toml")
CONFIG_ENV = "SLURM_GPU_MAIL_CONFIG"
DEFAULT_MAILER = "/usr/bin/mail"
# The whole summary (the report's queries included) gets this long; then the mail goes
# as Slurm wrote it.
DEFAULT_SUMMARY_TIMEOUT_S = 10.0
MAX_SUMMARY_TIMEOUT_S = 60.0
DEFAULT_MAILER_TIMEOUT_S = 120.0


class MailConfigError(ValueError):
    """The config file cannot be read or has a wrong key or value."""


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


def config_path() -> Path:
    return Path(os.environ.get(CONFIG_ENV) or DEFAULT_CONFIG)


def load_mail_config(path: Path) -> MailConfig:
    """The settings in ``path``; the defaults when it does not exist."""
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        return MailConfig()
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise MailConfigError(f"{path}: {exc}") from None
    known = {"mailer", "report", "prometheus_url", "report_args", "summary_timeout_seconds",
             "mailer_timeout_seconds", "log_file"}
    unknown = sorted(set(data) - known)
    if unknown:
        raise MailConfigError(f"{path}: unknown keys {', '.join(unknown)}; known: "
                              f"{', '.join(sorted(known))}")
    defaults = MailConfig()
    try:
        config = MailConfig(
            mailer=_absolute(data.get("mailer", defaults.mailer), "mailer"),
            report=_absolute(data.get("report", defaults.report), "report"),
            prometheus_url=_text(data.get("prometheus_url"), "prometheus_url"),
            report_args=tuple(_text(a, "report_args") or "" for a in
                              data.get("report_args", [])),
            summary_timeout_s=_seconds(data.get("summary_timeout_seconds",
                                                DEFAULT_SUMMARY_TIMEOUT_S),
                                       MAX_SUMMARY_TIMEOUT_S),
            mailer_timeout_s=_seconds(data.get("mailer_timeout_seconds",
                                               DEFAULT_MAILER_TIMEOUT_S), 3600),
            log_file=Path(data["log_file"]) if "log_file" in data else None)
    except (TypeError, ValueError) as exc:
        raise MailConfigError(f"{path}: {exc}") from None
    return config


def _text(value: object, key: str) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise ValueError(f"{key} must be a string")


def _absolute(value: object, key: str) -> str:
    text = _text(value, key)
    if not text or not text.startswith("/"):
        raise ValueError(f"{key} must be an absolute path (slurmctld gives MailProg no PATH)")
    return text


def _seconds(value: object, most: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= most:
        raise ValueError(f"timeouts are seconds, more than 0 and at most {most:g}")
    return float(value)
