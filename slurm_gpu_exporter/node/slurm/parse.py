"""What Slurm prints about a job, parsed: ``scontrol -o show job`` lines, ``sacct``
output, host lists and gres index lists.

Pure functions of strings, no I/O: slurm.py runs the commands and calls these.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import datetime

from slurm_gpu_exporter.model.job import JobDescription


@dataclass(frozen=True)
class SlurmJobInfo(JobDescription):
    """Job metadata as the controller (or accounting) reports it: the job description's
    fields (``job_gpus``: the gres indices this node gave the job, "0,1" style) plus
    what only Slurm says."""

    state: str = ""
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


# Keys whose values users choose freely; scontrol prints them after every field read
# here, so the line is cut at the first of them. (JobName, the other free field,
# comes second and is pinned by its neighbours: see parse_scontrol_job.)
FREE_TEXT_KEYS = frozenset({
    "Command", "WorkDir", "StdErr", "StdIn", "StdOut", "Comment", "AdminComment",
    "SystemComment", "Network", "MailUser", "Container", "ContainerID",
})
# Keys scontrol prints before JobName (nothing user-chosen precedes them).
BEFORE_NAME_KEYS = frozenset({"JobId", "ArrayJobId", "ArrayTaskId", "ArrayTaskThrottle",
                              "HetJobId", "HetJobOffset", "HetJobIdSet", "SLUID"})
# -d prints these once per node of the job.
PER_NODE_KEYS = frozenset({"Nodes", "CPU_IDs", "Mem", "GRES"})


class AmbiguousJobLine(ValueError):
    """A user-chosen value of the line looks like fields: it cannot be read safely."""


def parse_scontrol_job(line: str, node: str) -> SlurmJobInfo | None:
    """A SlurmJobInfo from one ``scontrol -o -d show job`` line, for this node's GPUs.

    No user-chosen text may stand for a field: the line is read only up to the first
    free-text field (StdOut, WorkDir, Comment, Command...), and the job name must be
    followed at once by UserId. Raises AmbiguousJobLine when a value looks like fields
    (a job name such as ``x UserId=root(0)``, a field printed twice): ask for the JSON.
    Returns None for a line that is no job.
    """
    pairs = parse_scontrol_line(line)
    if not pairs or pairs[0][0] != "JobId" or not pairs[0][1].isdigit():
        return None
    keys = [key for key, _ in pairs]
    if "JobName" not in keys:
        raise AmbiguousJobLine("no JobName field")
    name_at = keys.index("JobName")
    if keys[name_at + 1 : name_at + 2] != ["UserId"]:
        raise AmbiguousJobLine("the job name holds what looks like a field")
    head = pairs[: name_at + 1]
    if any(key not in BEFORE_NAME_KEYS for key, _ in head[:-1]):
        raise AmbiguousJobLine("an unexpected field before the job name")
    end = next((i for i, key in enumerate(keys) if key in FREE_TEXT_KEYS), len(pairs))
    trusted = pairs[:end]
    seen: set[str] = set()
    for key, _ in trusted:
        if key in seen and key not in PER_NODE_KEYS:
            raise AmbiguousJobLine(f"field {key} is printed twice")
        seen.add(key)
    fields = dict(trusted)
    user, uid = _name_and_id(fields.get("UserId", ""))
    job_gpus = ""
    current_nodes: list[str] = []
    for key, value in trusted:
        if key == "Nodes":
            try:
                current_nodes = expand_hostlist(value)
            except ValueError:  # a malformed or absurd list names no node of ours
                current_nodes = []
        elif key == "GRES" and node in current_nodes:
            job_gpus = gres_indices(value)
    return SlurmJobInfo(
        jobid=pairs[0][1],
        uid=uid,
        user=user,
        account=_null(fields.get("Account", "")),
        partition=_null(fields.get("Partition", "")),
        qos=_null(fields.get("QOS", "")),
        name=_null(fields.get("JobName", "")),
        state=fields.get("JobState", "").split()[0] if fields.get("JobState") else "",
        array_job_id=_null(fields.get("ArrayJobId", "")),
        array_task_id=_null(fields.get("ArrayTaskId", "")),
        job_gpus=job_gpus,
        start_time=_local_time(fields.get("StartTime", "")),
        sluid=_null(fields.get("SLUID", "")),
    )


def _number(value: object) -> int | None:
    """A JSON number as Slurm prints it: 22.05 a plain int, 23.02+ {"set", "number"}."""
    if isinstance(value, dict):
        if not value.get("set", True) or value.get("infinite"):
            return None
        value = value.get("number")
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""


def _gres_on_node(job: dict[str, object], node: str) -> str:
    """This node's GPU indices: ``gres_detail`` holds one entry per allocated node."""
    resources = job.get("job_resources")
    hosts: list[object] = []
    if isinstance(resources, dict):
        allocated = resources.get("allocated_nodes")  # 22.05
        nodes = resources.get("nodes")  # 23.11+: {"allocation": [{"name": ...}]}
        if isinstance(allocated, list):
            hosts = [h.get("nodename") if isinstance(h, dict) else None for h in allocated]
        elif isinstance(nodes, dict) and isinstance(nodes.get("allocation"), list):
            hosts = [h.get("name") if isinstance(h, dict) else None for h in nodes["allocation"]]
    details = job.get("gres_detail")
    if not isinstance(details, list):
        return ""
    for host, detail in zip(hosts, details, strict=False):
        if host == node and isinstance(detail, str):
            return gres_indices(detail)
    return ""


def parse_squeue_json(text: str, jobid: str, node: str) -> SlurmJobInfo | None:
    """The job ``jobid`` (a job id or SLUID) from ``squeue --json`` output, or None.

    Every value sits in its own JSON field, so no user-chosen text can stand for
    another; used where the one-line output is ambiguous. Raises ValueError for
    output that is not JSON.
    """
    document = json.loads(text)
    jobs = document.get("jobs") if isinstance(document, dict) else None
    for job in jobs if isinstance(jobs, list) else ():
        if not isinstance(job, dict):
            continue
        number = _number(job.get("job_id"))
        step_id = job.get("step_id")
        sluid = _text(job.get("sluid")) or (
            _text(step_id.get("sluid")) if isinstance(step_id, dict) else "")
        if jobid not in (str(number), sluid):
            continue
        state = job.get("job_state")
        if isinstance(state, list):  # 23.02+: a list of flags, the base state first
            state = state[0] if state else ""
        start = _number(job.get("start_time"))
        array_job = _number(job.get("array_job_id"))
        array_task = _number(job.get("array_task_id"))
        return SlurmJobInfo(
            jobid=str(number),
            uid=_number(job.get("user_id")),
            user=_text(job.get("user_name")),
            account=_text(job.get("account")),
            partition=_text(job.get("partition")),
            qos=_text(job.get("qos")),
            cluster=_text(job.get("cluster")),
            name=_text(job.get("name")),
            state=_text(state),
            array_job_id=str(array_job) if array_job else "",
            array_task_id=str(array_task) if array_job and array_task is not None else "",
            job_gpus=_gres_on_node(job, node),
            start_time=float(start) if start else None,
            sluid=sluid,
        )
    return None


# JobName last: a "|" in a job name then stays in the name (split at most 7 times).
SACCT_FIELDS = ("JobIDRaw", "User", "UID", "Account", "Partition", "Cluster", "State", "JobName")


def parse_sacct(output: str, jobid: str) -> SlurmJobInfo | None:
    """A SlurmJobInfo from ``sacct -X -n -P -o <SACCT_FIELDS>`` output."""
    for line in output.splitlines():
        values = line.split("|", len(SACCT_FIELDS) - 1)
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
