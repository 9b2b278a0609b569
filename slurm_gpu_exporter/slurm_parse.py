"""What Slurm prints about a job, parsed: ``scontrol -o show job`` lines, ``sacct``
output, host lists and gres index lists.

Pure functions of strings, no I/O: slurm.py runs the commands and calls these.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime


@dataclass(frozen=True)
class SlurmJobInfo:
    """Job metadata as the controller (or accounting) reports it."""

    jobid: str
    uid: int | None = None
    user: str = ""
    account: str = ""
    partition: str = ""
    cluster: str = ""
    name: str = ""
    state: str = ""
    array_job_id: str = ""
    array_task_id: str = ""
    # GPU indices this node gave the job (gres IDX), "0,1" style; "" if none/unknown.
    job_gpus: str = ""
    start_time: float | None = None
    sluid: str = ""  # Slurm 26.05+

    @property
    def finished(self) -> bool:
        """True once Slurm considers the job over (any state but pending/running/suspended...)."""
        return bool(self.state) and self.state not in _ACTIVE_STATES


_ACTIVE_STATES = frozenset(
    {"PENDING", "RUNNING", "SUSPENDED", "CONFIGURING", "COMPLETING", "RESIZING", "REQUEUED",
     "SIGNALING", "STAGE_OUT", "STOPPED"}
)


# --- parsing helpers (pure) -------------------------------------------------

_KEY_RE = re.compile(r"(?:^|\s)([A-Za-z][A-Za-z0-9_:/]*)=")


def parse_scontrol_line(line: str) -> list[tuple[str, str]]:
    """Split one ``scontrol -o show job`` line into (key, value) pairs, in order.

    Values may contain spaces (JobName, Command), so a value runs until the next
    `` Key=``. Keys may repeat (``-d`` prints Nodes=/GRES= per node).
    """
    matches = list(_KEY_RE.finditer(line))
    pairs = []
    for i, match in enumerate(matches):
        end = matches[i + 1].start() if i + 1 < len(matches) else len(line)
        pairs.append((match.group(1), line[match.end():end].strip()))
    return pairs


# Beyond any real cluster or node: a larger range is garbage, not a list to build.
MAX_HOSTS = 100_000
MAX_GPU_INDICES = 1024


def expand_hostlist(expr: str) -> list[str]:
    """Expand a Slurm hostlist such as ``gpu[01-03,07],cpu1`` into names."""
    hosts: list[str] = []
    for part in re.findall(r"[^,\[]+(?:\[[^\]]*\])?[^,]*", expr):
        match = re.fullmatch(r"([^\[]*)\[([^\]]*)\](.*)", part)
        if not match:
            hosts.append(part)
            continue
        prefix, ranges, suffix = match.groups()
        for item in ranges.split(","):
            lo, _, hi = item.partition("-")
            if not hi:
                hosts.append(f"{prefix}{lo}{suffix}")
                continue
            width = len(lo)
            if int(hi) - int(lo) + len(hosts) >= MAX_HOSTS:  # garbage, not a node list
                raise ValueError(f"hostlist {expr[:40]!r} names over {MAX_HOSTS} hosts")
            for n in range(int(lo), int(hi) + 1):
                hosts.append(f"{prefix}{n:0{width}d}{suffix}")
    return hosts


def gres_indices(gres: str) -> str:
    """GPU indices from a ``-d`` GRES value, e.g. ``gpu:a100:2(IDX:0,2-3)`` -> ``0,2,3``."""
    indices: list[str] = []
    for match in re.finditer(r"gpu(?::[^:(,]+)*:\d+\(IDX:([^)]*)\)", gres):
        for item in match.group(1).split(","):
            lo, _, hi = item.partition("-")
            if lo.isdigit() and hi.isdigit() and int(hi) - int(lo) < MAX_GPU_INDICES:
                indices.extend(str(n) for n in range(int(lo), int(hi) + 1))
            elif lo.isdigit():
                indices.append(lo)
    return ",".join(indices)


def _name_and_id(value: str) -> tuple[str, int | None]:
    """``alice(1001)`` -> ("alice", 1001)."""
    match = re.fullmatch(r"(.*)\((\d+)\)", value)
    if not match:
        return value, None
    return match.group(1), int(match.group(2))


def _null(value: str) -> str:
    return "" if value in ("(null)", "N/A", "None") else value


def _local_time(value: str) -> float | None:
    """Slurm prints times as local ISO timestamps without a zone; None for Unknown/None."""
    try:
        return datetime.fromisoformat(value).timestamp()
    except ValueError:
        return None


def parse_scontrol_job(line: str, node: str) -> SlurmJobInfo | None:
    """A SlurmJobInfo from one ``scontrol -o -d show job`` line, for this node's GPUs."""
    pairs = parse_scontrol_line(line)
    fields = dict(pairs)  # last wins; only per-node keys repeat and those are handled below
    jobid = fields.get("JobId", "")
    if not jobid.isdigit():
        return None
    user, uid = _name_and_id(fields.get("UserId", ""))
    job_gpus = ""
    current_nodes: list[str] = []
    for key, value in pairs:
        if key == "Nodes":
            try:
                current_nodes = expand_hostlist(value)
            except ValueError:  # a malformed or absurd list names no node of ours
                current_nodes = []
        elif key == "GRES" and node in current_nodes:
            job_gpus = gres_indices(value)
    return SlurmJobInfo(
        jobid=jobid,
        uid=uid,
        user=user,
        account=_null(fields.get("Account", "")),
        partition=_null(fields.get("Partition", "")),
        name=_null(fields.get("JobName", "")),
        state=fields.get("JobState", "").split()[0] if fields.get("JobState") else "",
        array_job_id=_null(fields.get("ArrayJobId", "")),
        array_task_id=_null(fields.get("ArrayTaskId", "")),
        job_gpus=job_gpus,
        start_time=_local_time(fields.get("StartTime", "")),
        sluid=_null(fields.get("SLUID", "")),
    )


SACCT_FIELDS = ("JobIDRaw", "User", "UID", "Account", "Partition", "Cluster", "JobName", "State")


def parse_sacct(output: str, jobid: str) -> SlurmJobInfo | None:
    """A SlurmJobInfo from ``sacct -X -n -P -o <SACCT_FIELDS>`` output."""
    for line in output.splitlines():
        values = line.split("|")
        if len(values) != len(SACCT_FIELDS) or values[0] != jobid:
            continue
        row = dict(zip(SACCT_FIELDS, values, strict=True))
        return SlurmJobInfo(
            jobid=jobid,
            uid=int(row["UID"]) if row["UID"].isdigit() else None,
            user=row["User"],
            account=row["Account"],
            partition=row["Partition"],
            cluster=row["Cluster"],
            name=row["JobName"],
            state=row["State"].split()[0] if row["State"] else "",
        )
    return None
