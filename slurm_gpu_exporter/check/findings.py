"""Findings of ``slurm-gpu-exporter check`` and how they are printed.

A finding is one line: what was seen and, where something is wrong, what to do.
Only ``block`` findings make the exit status 1: they stand between the agent and
right numbers. ``warn`` marks figures that will be missing or late, ``note`` a fact.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Literal

Severity = Literal["ok", "note", "warn", "block"]
SEVERITIES: tuple[Severity, ...] = ("ok", "note", "warn", "block")


@dataclass(frozen=True)
class Finding:
    """One line of the check: ``area`` is slurm, slurm.conf, cgroup, jobs, gpu, spool, state or
    training."""

    severity: Severity
    area: str
    message: str


def exit_code(findings: Iterable[Finding]) -> int:
    """1 when some finding blocks right numbers, else 0."""
    return 1 if any(f.severity == "block" for f in findings) else 0


def _inert(text: str) -> str:
    # Paths and names come from the node: no terminal control characters in the output.
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def render_text(findings: list[Finding]) -> str:
    """One line per finding, then a summary line."""
    lines = [f"{f.severity.upper():<5} {f.area}: {_inert(f.message)}" for f in findings]
    blocking = sum(f.severity == "block" for f in findings)
    warnings = sum(f.severity == "warn" for f in findings)
    if blocking:
        lines.append(f"{blocking} finding(s) block right numbers; fix those marked BLOCK "
                     f"({warnings} warning(s))")
    else:
        lines.append(f"nothing blocks right numbers ({warnings} warning(s))")
    return "\n".join(lines) + "\n"


def render_json(findings: list[Finding]) -> str:
    """``{"exit_code": 0|1, "findings": [{"severity", "area", "message"}, ...]}``."""
    return json.dumps({"exit_code": exit_code(findings),
                       "findings": [asdict(f) for f in findings]}, indent=2) + "\n"
