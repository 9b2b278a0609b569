"""The Slurm commands ``enforce`` and ``remediate`` run: list jobs, record a reason,
cancel, signal or requeue a job, look up a node, drain a node. The only module that runs
``scancel``, ``scontrol update`` and ``scontrol requeue``.

Every command is an argument list (never a shell) with a timeout. Job ids and node
names are checked against strict patterns before they reach a command line, and a
value never starts with ``-``, so no user-chosen text can become an option. A job is
acted on only under the one name Slurm resolves to exactly it (``SlurmJobId.target``):
an array task as ``A_T``, since the bare id of the task that holds the array's id
names every task of the array; a het job only as a whole, under its leader's id. A node is
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
from collections.abc import Sequence
from dataclasses import dataclass

from slurm_gpu_exporter.model.ids import is_job_target
from slurm_gpu_exporter.model.slurm_id import SlurmJobId
from slurm_gpu_exporter.report.errors import ReportError
from slurm_gpu_exporter.report.inert_text import plain, slurm_value
from slurm_gpu_exporter.report.slurm.squeue import (
    EXIT_SLURM,
    NODE_RE,
    SQUEUE_JSON,
    SlurmJob,
    parse_squeue_json,
)

COMMAND_TIMEOUT_S = 30.0
SBIN_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# The signals remediate may send a job before requeueing it (scancel --signal=NAME).
SIGNALS = frozenset({"USR1", "USR2", "TERM", "INT", "HUP", "QUIT", "CONT", "URG"})
# Which of a job's processes a signal reaches: the batch script only (scancel --batch),
# every step but the batch script (scancel's default), or all of them (--full).
SIGNAL_SCOPES = {"batch": ("--batch",), "steps": (), "full": ("--full",)}
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
    """Every job squeue lists, ended ones it still holds included, from one call;
    ReportError (exit 8) when it fails."""
    return parse_squeue_json(_run([_command("squeue"), *SQUEUE_JSON]))


def _checked_target(ident: SlurmJobId) -> str:
    """The one name Slurm resolves to this job (or its whole het job); ReportError where
    no id names it alone (an array's unsplit remainder)."""
    target = ident.target
    if target is None or not is_job_target(target):
        raise ReportError(f"refusing to act on {plain(ident.display)!r}: no Slurm job id "
                          "names that job alone", EXIT_SLURM)
    return target


def acted_on(job: SlurmJob, listed: dict[str, SlurmJob]) -> tuple[SlurmJob, ...]:
    """Every job Slurm lists that an action on ``job`` reaches: ``job`` alone, or each
    component of its het job; () where its identity is unknown."""
    if job.ident is None:
        return ()
    if not job.ident.is_het_component:
        return (job,)
    het = job.ident.het_job_id
    return tuple(sorted((j for j in listed.values()
                         if j.ident is not None and j.ident.het_job_id == het),
                        key=lambda j: int(j.ident.het_job_offset)))  # type: ignore[union-attr]


def still_as_listed(jobs: Sequence[SlurmJob]) -> bool:
    """Whether Slurm still runs ``jobs`` (one job, or every component of one het job) as
    they were listed (``same_as_listed``). One ``squeue`` for their target, asked right
    before a cancel."""
    if not jobs or any(j.ident is None for j in jobs):
        return False
    target = _checked_target(jobs[0].ident)  # type: ignore[arg-type]
    return same_as_listed(jobs, parse_squeue_json(
        _run([_command("squeue"), *SQUEUE_JSON, "--jobs", target])))


def same_as_listed(jobs: Sequence[SlurmJob], now: dict[str, SlurmJob]) -> bool:
    """Whether ``now`` (squeue's answer) lists exactly ``jobs`` under their one target:
    each RUNNING, with the same identity (array task, het offset) and start (a job
    requeued since has another, or is pending), and no het component more or less."""
    targets = {j.ident.target if j.ident is not None else None for j in jobs}
    if not jobs or len(targets) != 1 or None in targets:
        return False
    target = targets.pop()
    # Slurm 22.05's squeue --json ignores --jobs and lists every job: what the target
    # names is picked out by identity, not by what came back.
    named = {jobid: j for jobid, j in now.items()
             if j.ident is not None and j.ident.target == target}
    if set(named) != {j.jobid for j in jobs}:
        return False
    return all(named[j.jobid].running and named[j.jobid].ident == j.ident
               and named[j.jobid].start == j.start for j in jobs)


def record_reason(ident: SlurmJobId, reason: str) -> None:
    """Put ``reason`` in the job's AdminComment (sacct shows it where accounting is on)."""
    _run([_command("scontrol"), "update", f"JobId={_checked_target(ident)}",
          f"AdminComment={slurm_value(reason)}"])


def cancel_job(ident: SlurmJobId) -> None:
    """``scancel TARGET``: the array task ``A_T``, the whole het job, or the plain job."""
    _run([_command("scancel"), _checked_target(ident)])


def signal_job(ident: SlurmJobId, signal: str, scope: str) -> None:
    """``scancel --signal=SIGNAL [--batch|--full] TARGET``: only a signal of ``SIGNALS``
    and a scope of ``SIGNAL_SCOPES`` (ReportError otherwise)."""
    if signal not in SIGNALS or scope not in SIGNAL_SCOPES:
        raise ReportError(f"refusing to send {plain(signal)!r} to {plain(scope)!r}: not a "
                          "signal and scope remediate sends", 2)
    _run([_command("scancel"), f"--signal={signal}", *SIGNAL_SCOPES[scope],
          _checked_target(ident)])


def requeue_job(ident: SlurmJobId) -> None:
    """``scontrol requeue TARGET``: back to pending (running or finished batch jobs;
    Slurm refuses a job submitted with ``--no-requeue``)."""
    _run([_command("scontrol"), "requeue", _checked_target(ident)])


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
