"""Notes as data: declared rules (conditions over named facts, a message template).

A rule never runs code from the configuration: a condition compares one fact
with a number, and a message is a ``str.format`` template restricted to plain
fact names (no attribute or index access).
"""

from __future__ import annotations

import math
import operator
import string
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slurm_gpu_exporter.report.errors import ReportError
from slurm_gpu_exporter.report.figures.defaults import DEFAULT_CONFIG
from slurm_gpu_exporter.report.figures.gpu_events import WORDING
from slurm_gpu_exporter.report.figures.job_events import fault_lines, slowdown, xid_errors
from slurm_gpu_exporter.report.figures.shapes import JobDetail, JobUsage
from slurm_gpu_exporter.report.figures.table import FIGURES, job_shown
from slurm_gpu_exporter.report.relay_settings import (
    NO_SETTINGS,
    RelaySettings,
    parse_relay_settings,
)

GIB = 2**30
OPERATORS: dict[str, Callable[[float, float], bool]] = {
    "<": operator.lt, "<=": operator.le, "==": operator.eq, "!=": operator.ne,
    ">=": operator.ge, ">": operator.gt,
}


@dataclass(frozen=True)
class Condition:
    fact: str
    op: str
    value: float

    def holds(self, facts: Mapping[str, Any]) -> bool:
        # A number only: not None (unknown), text, a bool (its own type) or NaN. Tested
        # by type: the archive tests every note of thousands of jobs.
        value = facts.get(self.fact)
        kind = type(value)
        if (kind is not float and kind is not int) or value != value:
            return False
        return OPERATORS[self.op](value, self.value)


@dataclass(frozen=True)
class Rule:
    name: str
    when: tuple[Condition, ...]
    message: str
    stop: bool = False

    def applies(self, facts: Mapping[str, Any]) -> bool:
        # a loop: all() over a generator made notes_for 50 % slower (archive: every
        # note of thousands of jobs)
        for condition in self.when:  # noqa: SIM110
            if not condition.holds(facts):
                return False
        return True


@dataclass(frozen=True)
class Config:
    """The whole report configuration: thresholds, notes and the notification texts."""

    threshold: float
    min_gpu_hours: float
    chart_jobs: int
    memory_headroom: float
    time_headroom: float
    repeat_after_days: float
    subject: str
    template: str
    job_line: str
    notes: tuple[Rule, ...]
    emissions_gco2e_per_kwh: float | None = None  # None: no emissions shown
    # A PromQL expression of one series in gCO2e/kWh that the site fills; the constant
    # above is the fall-back where it has no data.
    emissions_series: str | None = None
    # low-util marks a job slowed by its GPU, not idle, from this share of its busy time
    slowed_share: float = 0.2
    # The mail relay's login ([notify] smtp_*), under the --smtp-* flags
    relay: RelaySettings = NO_SETTINGS


class _FactFormatter(string.Formatter):
    """``str.format`` limited to plain names: ``{x}`` and ``{x:.0%}``, never ``{x.attr}``."""

    def get_field(self, field_name: str, args: Any, kwargs: Any) -> Any:
        if not field_name.isidentifier():
            raise ReportError(f"bad template field {{{field_name}}}: use a plain fact name")
        if field_name not in kwargs:
            raise KeyError(field_name)
        return kwargs[field_name], field_name


_FORMATTER = _FactFormatter()


def render_template(template: str, facts: Mapping[str, Any]) -> str:
    """Fill a template from facts; ReportError naming the field that is missing or bad."""
    try:
        return _FORMATTER.format(template, **facts)
    except KeyError as exc:
        raise ReportError(f"template names an unknown fact {exc}") from None
    except (ValueError, TypeError) as exc:
        raise ReportError(f"bad template: {exc}") from None


def notes_for(facts: Mapping[str, Any], rules: tuple[Rule, ...]) -> list[str]:
    """The messages of the rules that apply, in order, until a ``stop`` rule."""
    notes = []
    for rule in rules:
        if rule.applies(facts):
            notes.append(render_template(rule.message, facts))
            if rule.stop:
                break
    return notes


# --- facts ----------------------------------------------------------------------------


def hms(seconds: float) -> str:
    """Slurm's time format: ``[D-]HH:MM:SS``."""
    seconds = round(seconds)
    days, rest = divmod(seconds, 86400)
    text = f"{rest // 3600:02d}:{rest % 3600 // 60:02d}:{rest % 60:02d}"
    return f"{days}-{text}" if days else text


_GPM = tuple(f for f in FIGURES if f.combine == "gpm")  # activities shown as shares


def job_facts(detail: JobDetail, config: Config) -> dict[str, Any]:
    """The named facts the notes can test and print, for one job."""
    usage = detail.usage
    facts: dict[str, Any] = {
        "jobid": usage.jobid, "user": usage.user, "account": usage.account,
        "name": usage.name, "gpus": usage.gpus, "gpu_hours": usage.gpu_hours,
        "gpu_busy_ratio": usage.busy_ratio, "idle_gpus": usage.idle_gpus,
        "used_gpus": usage.gpus - usage.idle_gpus,
        "wasted_gpu_hours": usage.wasted_gpu_hours,
        "memory_request_gib": _gib(detail.memory_request),
        "cpu_efficiency": detail.cpu_efficiency, "cpus": detail.cpus,
        "finished": 0 if detail.running else 1,
        "runtime_s": detail.elapsed_s,
        "runtime": hms(detail.elapsed_s) if detail.elapsed_s is not None else "?",
        "emissions_gco2e": detail.emissions_gco2e,
        # every job figure of figures/table.py under its `job --format json` key
        # (gpu_memory_peak_gib, memory_peak_gib, energy_kwh, ...), and the GPM
        # activities as shares of the time held on GPUs that measure them
        **job_shown(detail),
        **{f.ratio: usage.activity_ratio(f.job_attr) for f in _GPM},
    }
    if detail.memory_peak is not None and detail.memory_request:
        facts["memory_used_ratio"] = detail.memory_peak / detail.memory_request
        facts["suggested_memory_gib"] = max(1, math.ceil(
            detail.memory_peak * (1 + config.memory_headroom) / GIB))
    facts.update(_gpu_event_facts(detail))
    limit = detail.accounting.time_limit_s if detail.accounting else None
    if limit and detail.elapsed_s is not None:
        facts["time_limit"] = hms(limit)
        facts["time_used_ratio"] = detail.elapsed_s / limit
        minutes = max(1, math.ceil(detail.elapsed_s * (1 + config.time_headroom) / 60))
        facts["suggested_time"] = hms(minutes * 60)
    return facts


def _gpu_event_facts(detail: JobDetail) -> dict[str, Any]:
    """The GPU that a slowing reason held back the most, and the GPUs' errors."""
    facts: dict[str, Any] = {"gpu_xid_errors": xid_errors(detail),
                             "gpu_error_list": "; ".join(fault_lines(detail)[:5])}
    slow = slowdown(detail)
    if slow is not None:
        facts.update(gpu_slowed_ratio=slow.busy_ratio, gpu_slowed_held_ratio=slow.held_ratio,
                     slowed_gpu=slow.gpu, slowed_reason=slow.words)
    return facts


def low_util_note(job: JobUsage, slowed_share: float) -> str | None:
    """low-util's mark for a job slowed by its GPU rather than idle (a slowing reason
    took ``slowed_share`` of its busy GPU time or more); None otherwise."""
    ratio = job.slowed_ratio
    if ratio is None or ratio < slowed_share:
        return None
    words = WORDING.get(job.slowed_reason, job.slowed_reason)
    return f"slowed by its GPU rather than idle: {words} {ratio:.0%} of its busy GPU time"


def _gib(value: float | None) -> float | None:
    return value / GIB if value is not None else None


# --- configuration --------------------------------------------------------------------


def load_config(path: str | None) -> Config:
    """The defaults, with a site's TOML file (if given) on top."""
    data = tomllib.loads(DEFAULT_CONFIG)
    if path is not None:
        try:
            site = tomllib.loads(Path(path).read_text())
        except OSError as exc:
            raise ReportError(f"cannot read the config {path}: {exc.strerror}") from None
        except tomllib.TOMLDecodeError as exc:
            raise ReportError(f"bad TOML in {path}: {exc}") from None
        data = _merge(data, site)
    try:
        return _config(data)
    except (KeyError, TypeError, ValueError) as exc:
        where = path or "the defaults"
        raise ReportError(f"bad configuration in {where}: {exc}") from None


def _merge(base: dict[str, Any], site: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for section in ("low_util", "facts", "notify", "energy"):
        merged[section] = {**base.get(section, {}), **site.get(section, {})}
    notes = {n["name"]: n for n in base["notes"]}
    for note in site.get("notes", []):
        if not isinstance(note, dict) or "name" not in note:
            raise ReportError("bad configuration: every [[notes]] entry needs a name")
        notes[note["name"]] = note
    merged["notes"] = list(notes.values())
    return merged


def _rule(entry: dict[str, Any]) -> Rule:
    conditions = []
    for cond in entry.get("when", []):
        if cond["op"] not in OPERATORS:
            raise ValueError(f"note {entry['name']}: unknown operator {cond['op']!r}")
        conditions.append(Condition(str(cond["fact"]), cond["op"], float(cond["value"])))
    if not conditions:
        raise ValueError(f"note {entry['name']} has no conditions")
    list(_FORMATTER.parse(entry["message"]))  # a malformed template fails here, early
    return Rule(entry["name"], tuple(conditions), str(entry["message"]),
                bool(entry.get("stop", False)))


def _config(data: dict[str, Any]) -> Config:
    low, facts, notify = data["low_util"], data["facts"], data["notify"]
    threshold = float(low["threshold"])
    if not 0 < threshold <= 1:
        raise ValueError("low_util.threshold must be in (0, 1]")
    return Config(
        threshold=threshold, min_gpu_hours=float(low["min_gpu_hours"]),
        chart_jobs=int(low["chart_jobs"]),
        memory_headroom=float(facts["memory_headroom"]),
        time_headroom=float(facts["time_headroom"]),
        repeat_after_days=float(notify["repeat_after_days"]),
        subject=str(notify["subject"]), template=str(notify["template"]),
        job_line=str(notify["job_line"]),
        notes=tuple(_rule(n) for n in data["notes"] if n.get("enabled", True)),
        emissions_gco2e_per_kwh=_emissions_factor(data.get("energy", {})),
        emissions_series=_emissions_series(data.get("energy", {})),
        slowed_share=_share_of(low, "slowed_share", 0.2),
        relay=parse_relay_settings(notify, "the configuration"),
    )


def _share_of(section: dict[str, Any], key: str, default: float) -> float:
    value = float(section.get(key, default))
    if not 0 < value <= 1:
        raise ValueError(f"low_util.{key} must be in (0, 1]")
    return value


def _emissions_series(energy: dict[str, Any]) -> str | None:
    series = energy.get("emissions_series", "")
    if not isinstance(series, str) or len(series) > 1000 or "\n" in series:
        raise ValueError("energy.emissions_series must be one line of PromQL (a metric name "
                         "or selector in gCO2e/kWh), at most 1000 characters")
    return series.strip() or None


def _emissions_factor(energy: dict[str, Any]) -> float | None:
    factor = float(energy.get("emissions_gco2e_per_kwh", 0))
    if not 0 <= factor < 10_000:
        raise ValueError("energy.emissions_gco2e_per_kwh must be in 0..10000 gCO2e/kWh")
    return factor or None
