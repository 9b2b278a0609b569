"""The slurm.conf settings the agent depends on: Prolog/Epilog, PrologFlags and
JobAcctGatherType, read from ``scontrol show config`` or from a slurm.conf file."""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Mapping
from pathlib import Path

from slurm_gpu_exporter.check.findings import Finding

DEFAULT_PREFIX = "/opt/slurm-gpu-exporter"
DEFAULTS_FILE = "/etc/default/slurm-gpu-exporter"
# What the shipped wrapper scripts set, with their own default.
_SCRIPT_DEFAULTS_RE = re.compile(r"^defaults=(\S+)\s*$", re.M)
_SCRIPT_PREFIX_RE = re.compile(r"^prefix=(\S+)\s*$", re.M)
_LINE_RE = re.compile(r"^\s*([A-Za-z][A-Za-z0-9]*)\s*=\s*(.*?)\s*$")
_KEYS = ("prolog", "epilog", "prologflags", "jobacctgathertype")


def parse_config(text: str) -> dict[str, list[str]]:
    """Lower-cased key -> values, from either ``scontrol show config`` (``Key = value``)
    or slurm.conf (``Key=value``, ``#`` comments). Only the keys the check needs; a key
    given more than once keeps every value (Slurm runs several Prolog entries)."""
    found: dict[str, list[str]] = {}
    for raw in text.splitlines():
        line = raw.split("#", 1)[0]
        m = _LINE_RE.match(line)
        if m is None:
            continue
        key, value = m.group(1).lower(), m.group(2)
        if key in _KEYS and value and value != "(null)":
            found.setdefault(key, []).append(value)
    return found


def _scripts(value: str) -> list[Path]:
    """The files one Prolog/Epilog value names: a file, a directory of them, or a glob."""
    path = Path(value)
    if any(c in value for c in "*?["):
        return [Path(p) for p in sorted(glob.glob(value)) if os.path.isfile(p)]
    if path.is_dir():
        return sorted(p for p in path.iterdir() if p.is_file())
    return [path]


def _read(path: Path) -> str:
    try:
        with open(path, "rb") as f:
            return f.read(65536).decode("utf-8", "replace")
    except OSError:
        return ""


def _prefix_of(script: str) -> str:
    """The install prefix a shipped wrapper execs from (its defaults file may move it)."""
    m = _SCRIPT_DEFAULTS_RE.search(script)
    defaults = m.group(1) if m else DEFAULTS_FILE
    for line in _read(Path(defaults)).splitlines():
        key, _, value = line.strip().partition("=")
        if key.strip() == "SLURM_GPU_EXPORTER_PREFIX" and value.strip():
            return value.strip().strip("\"'")
    m = _SCRIPT_PREFIX_RE.search(script)
    return m.group(1) if m else DEFAULT_PREFIX


def check_hook(kind: str, values: list[str]) -> Finding:
    """Whether slurm.conf's ``Prolog``/``Epilog`` (kind) reaches the exporter's script."""
    key = kind.capitalize()
    entry = f"slurm-gpu-exporter-{kind}"
    missing = "block" if kind == "prolog" else "warn"
    why = ("jobs' GPUs and users are known only through their processes"
           if kind == "prolog" else "ended jobs are noticed only when their cgroup is gone")
    if not values:
        return Finding(missing, "slurm.conf",
                       f"no {key} is set, so {why}; set {key}=/opt/slurm-gpu-exporter/"
                       f"{kind}/slurm-gpu-exporter.sh (or call it from your {kind})")
    scripts = [p for value in values for p in _scripts(value)]
    for script in scripts:
        text = _read(script)
        if entry not in text and entry not in script.name:
            continue
        if not os.access(script, os.X_OK):
            return Finding(missing, "slurm.conf",
                           f"{key} {script} is not executable, so slurmd cannot run it; "
                           f"fix: chmod 0755 {script}")
        if entry in script.name:
            return Finding("ok", "slurm.conf", f"{key} runs {script}")
        target = Path(_prefix_of(text)) / "bin" / entry
        if not os.access(target, os.X_OK):
            return Finding(missing, "slurm.conf",
                           f"{key} {script} execs {target}, which is missing or not "
                           f"executable, so {why}; install the exporter there or set "
                           f"SLURM_GPU_EXPORTER_PREFIX in {DEFAULTS_FILE}")
        return Finding("ok", "slurm.conf", f"{key} {script} reaches {target}")
    shown = ", ".join(values)
    return Finding(missing, "slurm.conf",
                   f"{key}={shown} does not run {entry}, so {why}; call "
                   f"/opt/slurm-gpu-exporter/{kind}/slurm-gpu-exporter.sh from it")


def check_config(config: Mapping[str, list[str]], cgroup_version: int) -> list[Finding]:
    """Findings on the Prolog, Epilog, PrologFlags and JobAcctGatherType settings."""
    findings = [check_hook("prolog", config.get("prolog", [])),
                check_hook("epilog", config.get("epilog", []))]
    flags = {f.strip().lower() for v in config.get("prologflags", []) for f in v.split(",")}
    if "alloc" in flags:
        findings.append(Finding("ok", "slurm.conf",
                                f"PrologFlags={','.join(sorted(flags))}: the prolog runs "
                                f"when a job is allocated"))
    else:
        findings.append(Finding("warn", "slurm.conf",
                                "PrologFlags lacks Alloc, so the prolog runs only at a job's "
                                "first step and a job that holds GPUs before it shows late; "
                                "set PrologFlags=Alloc,Contain"))
    gather = (config.get("jobacctgathertype") or ["jobacct_gather/none"])[-1]
    if cgroup_version == 1 and gather != "jobacct_gather/cgroup":
        findings.append(Finding("warn", "slurm.conf",
                                f"JobAcctGatherType={gather} on cgroup v1: Slurm makes no "
                                f"cpuacct job cgroups, so jobs' CPU time is missing; set "
                                f"JobAcctGatherType=jobacct_gather/cgroup"))
    else:
        findings.append(Finding("ok", "slurm.conf", f"JobAcctGatherType={gather}"
                                + ("" if cgroup_version == 1 else
                                   " (cgroup v2: CPU time comes from cpu.stat either way)")))
    return findings
