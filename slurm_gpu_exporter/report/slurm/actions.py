"""The Slurm commands ``enforce`` and ``remediate`` run: list jobs, record a reason,
cancel a job, look up a node, drain a node. The only module that runs ``scancel`` and
``scontrol update``.

Every command is an argument list (never a shell) with a timeout. Job ids and node
names are checked against strict patterns before they reach a command line, and a
value never starts with ``-``, so no user-chosen text can become an option. A node is
acted on only under a name Slurm lists as exactly that one node: never ``ALL``, a
NodeSet or a name Slurm does not know. Free text (a job's name) is read from
``squeue --json`` (``squeue.py``) and never parsed for other fields; every text put in
a reason goes through ``slurm_value``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass

from slurm_gpu_exporter.report.errors import ReportError
from slurm_gpu_exporter.report.inert_text import plain, slurm_value
from slurm_gpu_exporter.report.slurm.squeue import EXIT_SLURM, NODE_RE, SlurmJob, parse_squeue_json

COMMAND_TIMEOUT_S = 30.0
SBIN_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
JOBID_RE = re.compile(r"[0-9]+")
# Names scontrol takes for more than one node.
_MANY_NODES = frozenset({"ALL"})


@dataclass(frozen=True)
class SlurmNode:
    """A node as ``scontrol show node`` lists it."""

    name: str
    state: str  # IDLE, MIXED+DRAIN, ...


def _command(name: str) -> str:
    found = shutil.which(name, path=os.environ.get("PATH", "") + ":" + SBIN_PATH)
    if found is None:
        raise ReportError(f"{name} is not installed or not on PATH: install the Slurm client "
                          "commands on this host", EXIT_SLURM)
    return found


def _call(argv: list[str]) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(argv, capture_output=True, text=True,
                              timeout=COMMAND_TIMEOUT_S, check=False, errors="replace")
    except subprocess.TimeoutExpired:
        raise ReportError(f"{os.path.basename(argv[0])} did not answer within "
                          f"{COMMAND_TIMEOUT_S:g} s; is slurmctld up?", EXIT_SLURM) from None
    except OSError as exc:
        raise ReportError(f"cannot run {argv[0]}: {exc.strerror}", EXIT_SLURM) from None


def _failed(argv: list[str], proc: subprocess.CompletedProcess[str]) -> ReportError:
    detail = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else \
        f"exit status {proc.returncode}"
    return ReportError(f"{os.path.basename(argv[0])} {argv[1]} failed: {plain(detail)}",
                       EXIT_SLURM)


def _run(argv: list[str]) -> str:
    proc = _call(argv)
    if proc.returncode != 0:
        raise _failed(argv, proc)
    return proc.stdout


def listed_jobs() -> dict[str, SlurmJob]:
    """Every job squeue lists, from one call; ReportError (exit 8) when it fails."""
    return parse_squeue_json(_run([_command("squeue"), "--json"]))


def _checked_jobid(jobid: str) -> str:
    if not JOBID_RE.fullmatch(jobid):
        raise ReportError(f"refusing to act on {plain(jobid)!r}: not a Slurm job id",
                          EXIT_SLURM)
    return jobid


def still_as_listed(job: SlurmJob) -> bool:
    """Whether Slurm still runs ``job`` as it was listed: RUNNING, with the same start
    (a job requeued since has another, or is pending). One ``squeue`` for the job,
    asked right before a cancel."""
    argv = [_command("squeue"), "--json", "--jobs", _checked_jobid(job.jobid)]
    now = parse_squeue_json(_run(argv)).get(job.jobid)
    return now is not None and now.running and now.start == job.start


def record_reason(jobid: str, reason: str) -> None:
    """Put ``reason`` in the job's AdminComment (sacct shows it where accounting is on)."""
    _run([_command("scontrol"), "update", f"JobId={_checked_jobid(jobid)}",
          f"AdminComment={slurm_value(reason)}"])


def cancel_job(jobid: str) -> None:
    """``scancel JOBID``."""
    _run([_command("scancel"), _checked_jobid(jobid)])


def is_node_name(name: str) -> bool:
    """Whether ``name`` is a plain host name, and not one scontrol takes for many nodes."""
    return bool(NODE_RE.fullmatch(name)) and name.upper() not in _MANY_NODES


def checked_node(name: str) -> str:
    """``name`` when it is a plain host name and not one that names many nodes;
    ReportError otherwise."""
    if not is_node_name(name):
        raise ReportError(f"refusing to act on the node {plain(name)!r}: not a node name", 2)
    return name


def listed_node(name: str) -> SlurmNode | None:
    """The node Slurm lists under exactly ``name``, or None where it lists none (a name
    it does not know) or something else (a NodeSet, ``ALL``: more lines, other names).
    ReportError (exit 8) when scontrol fails otherwise."""
    argv = [_command("scontrol"), "-o", "show", "node", checked_node(name)]
    proc = _call(argv)
    if proc.returncode != 0:
        if "not found" in proc.stdout + proc.stderr:
            return None
        raise _failed(argv, proc)
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    if len(lines) != 1:
        return None
    listed = re.match(r"NodeName=(\S+)", lines[0])
    state = re.search(r"(?:^|\s)State=(\S+)", lines[0])
    if listed is None or listed.group(1) != name:
        return None
    return SlurmNode(name, state.group(1) if state else "")


def drain_node(name: str, reason: str) -> None:
    """``scontrol update NodeName=… State=DRAIN Reason=…``."""
    _run([_command("scontrol"), "update", f"NodeName={checked_node(name)}", "State=DRAIN",
          f"Reason={slurm_value(reason)}"])
