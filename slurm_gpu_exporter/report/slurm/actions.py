"""The Slurm commands ``enforce`` and ``remediate`` run: list running jobs, record a
reason, cancel a job, drain a node.

Every command is an argument list (never a shell) with a timeout. Job ids and node
names are checked against strict patterns before they reach a command line, and a
value never starts with ``-``, so no user-chosen text can become an option. Free
text (a job's name) is read from ``squeue --json`` and never parsed for other fields.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass

from slurm_gpu_exporter.report.errors import ReportError

EXIT_SLURM = 8
COMMAND_TIMEOUT_S = 30.0
SBIN_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
JOBID_RE = re.compile(r"[0-9]+")
NODE_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
# What Slurm keeps in a reason or comment: no quotes, no newlines, bounded length.
_UNSAFE_RE = re.compile(r"[^A-Za-z0-9 ._:,;/()%=+@-]")


@dataclass(frozen=True)
class SlurmJob:
    """A running job as Slurm lists it."""

    jobid: str
    user: str
    account: str
    partition: str
    qos: str
    name: str


def inert(text: str, limit: int = 200) -> str:
    """Text safe for a Slurm reason or comment: unusual characters become ``_``."""
    return _UNSAFE_RE.sub("_", text)[:limit]


def _command(name: str) -> str:
    found = shutil.which(name, path=os.environ.get("PATH", "") + ":" + SBIN_PATH)
    if found is None:
        raise ReportError(f"{name} is not installed or not on PATH: install the Slurm client "
                          "commands on this host", EXIT_SLURM)
    return found


def _run(argv: list[str]) -> str:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S,
                              check=False, errors="replace")
    except subprocess.TimeoutExpired:
        raise ReportError(f"{os.path.basename(argv[0])} did not answer within "
                          f"{COMMAND_TIMEOUT_S:g} s; is slurmctld up?", EXIT_SLURM) from None
    except OSError as exc:
        raise ReportError(f"cannot run {argv[0]}: {exc.strerror}", EXIT_SLURM) from None
    if proc.returncode != 0:
        detail = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else \
            f"exit status {proc.returncode}"
        raise ReportError(f"{os.path.basename(argv[0])} {argv[1]} failed: {detail}",
                          EXIT_SLURM)
    return proc.stdout


def _state(value: object) -> str:
    # Slurm 22.05 prints "RUNNING"; later releases a list of flags.
    if isinstance(value, list):
        return str(value[0]) if value else ""
    return str(value or "")


def parse_squeue_json(text: str) -> dict[str, SlurmJob]:
    """``squeue --json`` -> the RUNNING jobs by job id."""
    try:
        jobs = json.loads(text)["jobs"]
    except (ValueError, KeyError, TypeError):
        raise ReportError("squeue --json printed something else than its JSON; check the "
                          "Slurm release (21.08 or later is needed)", EXIT_SLURM) from None
    running = {}
    for job in jobs:
        if not isinstance(job, dict) or _state(job.get("job_state")) != "RUNNING":
            continue
        jobid = str(job.get("job_id", ""))
        running[jobid] = SlurmJob(
            jobid=jobid, user=str(job.get("user_name", "")),
            account=str(job.get("account", "")), partition=str(job.get("partition", "")),
            qos=str(job.get("qos", "")), name=str(job.get("name", "")))
    return running


def running_jobs() -> dict[str, SlurmJob]:
    """Every RUNNING job, from one squeue call; ReportError (exit 8) when it fails."""
    return parse_squeue_json(_run([_command("squeue"), "--json"]))


def _checked_jobid(jobid: str) -> str:
    if not JOBID_RE.fullmatch(jobid):
        raise ReportError(f"refusing to act on {jobid!r}: not a Slurm job id", EXIT_SLURM)
    return jobid


def record_reason(jobid: str, reason: str) -> None:
    """Put ``reason`` in the job's AdminComment (sacct shows it where accounting is on)."""
    _run([_command("scontrol"), "update", f"JobId={_checked_jobid(jobid)}",
          f"AdminComment={inert(reason)}"])


def cancel_job(jobid: str) -> None:
    """``scancel JOBID``."""
    _run([_command("scancel"), _checked_jobid(jobid)])


def checked_node(name: str) -> str:
    """``name`` when it is a plain host name; ReportError otherwise."""
    if not NODE_RE.fullmatch(name):
        raise ReportError(f"refusing to act on the node {name!r}: not a node name", 2)
    return name


def node_state(name: str) -> str:
    """The node's state words (``IDLE``, ``MIXED+DRAIN``, ...), from scontrol."""
    out = _run([_command("scontrol"), "-o", "show", "node", checked_node(name)])
    match = re.search(r"(?:^|\s)State=(\S+)", out)
    return match.group(1) if match else ""


def drain_node(name: str, reason: str) -> None:
    """``scontrol update NodeName=… State=DRAIN Reason=…``."""
    _run([_command("scontrol"), "update", f"NodeName={checked_node(name)}", "State=DRAIN",
          f"Reason={inert(reason)}"])
