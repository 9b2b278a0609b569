"""What Slurm accounting knows and the metrics do not: state, exit code, limits, requests.

One ``sacct`` call for all the jobs of a report (by id for ``job``, by time window
for ``archive``). The agent's Slurm adapter
(``slurm_gpu_exporter.node.slurm.lookup``) answers the agent's questions and carries no time
limit or memory request, so these fields are asked for here. A site without
accounting (or without the Slurm commands) gets ``None`` and the notes that need
these fields stay silent.
"""

from __future__ import annotations

import logging
import re
import shutil
import subprocess
from datetime import datetime

from slurm_gpu_exporter.report.figures.shapes import Accounting

log = logging.getLogger(__name__)

SACCT_TIMEOUT_S = 10.0
FIELDS = ("JobIDRaw", "State", "Timelimit", "ReqMem", "AllocCPUS", "NNodes", "Start", "End",
          "ExitCode", "Account", "QOS", "ReqTRES")
_MEM_UNITS = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def parse_timelimit(text: str) -> float | None:
    """``[D-]HH:MM:SS``, ``MM:SS``, ``MM`` -> seconds; None for UNLIMITED/Partition_Limit."""
    match = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", text.strip())
    if not match:
        return None
    days, a, b, c = match.groups()
    if c is not None:
        seconds = int(a) * 3600 + int(b) * 60 + int(c)
    elif b is not None:
        seconds = int(a) * 60 + int(b) if days is None else int(a) * 3600 + int(b) * 60
    else:
        seconds = int(a) * 60 if days is None else int(a) * 3600
    return seconds + int(days or 0) * 86400


def parse_reqmem(text: str, cpus: int | None, nodes: int | None) -> float | None:
    """``4000M``, ``16Gn`` (per node), ``2Gc`` (per CPU) -> bytes for the whole job."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([KMGT])?([nc])?", text.strip())
    if not match:
        return None
    number, unit, per = match.groups()
    value = float(number) * _MEM_UNITS.get(unit or "M", 2**20)
    if per == "c":
        return value * cpus if cpus else None
    return value * (nodes or 1) if per == "n" else value


def parse_gpus(tres: str) -> int | None:
    """The GPU count of a TRES list (``cpu=2,mem=1G,gres/gpu=2`` -> 2); None without GPUs."""
    for item in tres.split(","):
        key, _, value = item.partition("=")
        if key == "gres/gpu" and value.isdigit():
            return int(value)
    return None


def _time(text: str) -> float | None:
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        return None


def parse_sacct(output: str) -> dict[str, Accounting]:
    """``sacct -X -n -P -o <FIELDS>`` output -> Accounting by job id."""
    found = {}
    for line in output.splitlines():
        values = line.split("|")
        if len(values) != len(FIELDS):
            continue
        row = dict(zip(FIELDS, values, strict=True))
        cpus = int(row["AllocCPUS"]) if row["AllocCPUS"].isdigit() else None
        nodes = int(row["NNodes"]) if row["NNodes"].isdigit() else None
        found[row["JobIDRaw"]] = Accounting(
            state=row["State"].split()[0] if row["State"] else "",
            time_limit_s=parse_timelimit(row["Timelimit"]),
            requested_memory=parse_reqmem(row["ReqMem"], cpus, nodes),
            cpus=cpus, nodes=nodes, start=_time(row["Start"]), end=_time(row["End"]),
            exit_code=row["ExitCode"], account=row["Account"], qos=row["QOS"],
            requested_gpus=parse_gpus(row["ReqTRES"]),
        )
    return found


def sacct_accounting(jobids: list[str], sacct: str | None = None) -> dict[str, Accounting]:
    """Accounting of the jobs from one sacct call; empty when sacct is absent or fails."""
    if not jobids:
        return {}
    return _run_sacct(["-j", ",".join(jobids)], sacct)


def sacct_window(start: float, end: float, sacct: str | None = None) -> dict[str, Accounting]:
    """Accounting of every job of every user that ran in [start, end], from one sacct call
    (its size does not grow with a list of ids); empty when sacct is absent or fails."""
    # sacct reads -S/-E in the local time zone, as it prints Start/End.
    def local(t: float) -> str:
        return datetime.fromtimestamp(t).strftime("%Y-%m-%dT%H:%M:%S")

    return _run_sacct(["-a", "-S", local(start), "-E", local(end)], sacct)


def _run_sacct(selection: list[str], sacct: str | None) -> dict[str, Accounting]:
    sacct = sacct or shutil.which("sacct")
    if not sacct:
        return {}
    argv = [sacct, "-X", "-n", "-P", *selection, "-o", ",".join(FIELDS)]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=SACCT_TIMEOUT_S,
                              check=False, errors="replace")
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.info("sacct not usable (%s): no time limits or memory requests", exc)
        return {}
    if proc.returncode != 0:
        log.info("sacct failed (%s): no time limits or memory requests",
                 proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else proc.returncode)
        return {}
    return parse_sacct(proc.stdout)


def sacct_owners(jobids: list[str], sacct: str | None = None) -> dict[str, str]:
    """The user of each job sacct knows (``sacct -X -n -P -o JobIDRaw,User``)."""
    sacct = sacct or shutil.which("sacct")
    if not sacct or not jobids:
        return {}
    try:
        proc = subprocess.run([sacct, "-X", "-n", "-P", "-j", ",".join(jobids), "-o",
                               "JobIDRaw,User"], capture_output=True, text=True, timeout=10,
                              check=False, errors="replace")
    except (OSError, subprocess.TimeoutExpired):
        return {}
    owners = {}
    for line in proc.stdout.splitlines() if proc.returncode == 0 else ():
        jobid, _, user = line.partition("|")
        if jobid in jobids and user:
            owners[jobid] = user
    return owners
