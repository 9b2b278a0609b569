"""What ``squeue --json`` says about each job: who, where, how many GPUs, in what state.

Pure parsing. Every value is its own JSON field, so free text (a job's name) never
feeds another field. The nodes come from the job's allocation (22.05-23.02:
``job_resources.allocated_nodes[].nodename``; 23.11 and later:
``job_resources.nodes.allocation[].name``), or from ``nodes`` when that is one plain
name; the GPU count from ``gres/gpu=`` in ``tres_alloc_str``; who the job is (array
task, het component) as a ``SlurmJobId``. What cannot be read is None, and ``enforce``
then treats the job as doubtful.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from slurm_gpu_exporter.model.slurm_id import SlurmJobId
from slurm_gpu_exporter.report.errors import ReportError

EXIT_SLURM = 8
# squeue's JSON of every job it holds. Since 24.05 its default state filter applies to
# --json too and hides a job that ended a moment ago (22.05 listed every job whatever the
# filter): a job that checkpointed and exited would read as gone.
SQUEUE_JSON = ("--json", "--states=all")
NODE_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_GPU_TRES = re.compile(r"(?:^|,)gres/gpu=(\d+)(?:,|$)")


@dataclass(frozen=True)
class SlurmJob:
    """A job as Slurm lists it."""

    jobid: str
    user: str
    account: str
    partition: str
    qos: str
    name: str
    state: str = "RUNNING"
    nodes: tuple[str, ...] | None = None  # None: Slurm's answer did not say
    gpus: int | None = None  # allocated GPUs, all nodes together; None: not said
    start: float | None = None  # when it started (a requeued job starts again later)
    # Its array task or het component; None: Slurm's fields for them did not parse.
    ident: SlurmJobId | None = None
    # The user's free text (sbatch --comment): only ever searched for a whole word.
    comment: str = ""
    # Whether Slurm may requeue it (sbatch --requeue/--no-requeue); None: not said.
    requeue: bool | None = None
    # Whether it is a batch job (sbatch: ``batch_flag``, 22.05 and later); an salloc or
    # srun allocation is not, and Slurm requeues only batch jobs. None: not said.
    batch: bool | None = None

    @property
    def running(self) -> bool:
        return self.state == "RUNNING"

    @property
    def shown(self) -> str:
        """The id as users know it (``1234_5``), or the bare id where the identity is
        not known."""
        return self.ident.display if self.ident is not None else self.jobid


def _state(value: object) -> str:
    # Slurm 22.05 prints "RUNNING"; later releases a list of flags.
    if isinstance(value, list):
        return str(value[0]) if value else ""
    return str(value or "")


def _nodes(job: dict[str, object]) -> tuple[str, ...] | None:
    resources = job.get("job_resources")
    names: list[object] = []
    if isinstance(resources, dict):
        allocated = resources.get("allocated_nodes")
        nodes = resources.get("nodes")
        if isinstance(allocated, list):
            names = [n.get("nodename") for n in allocated if isinstance(n, dict)]
        elif isinstance(nodes, dict) and isinstance(nodes.get("allocation"), list):
            names = [n.get("name") for n in nodes["allocation"] if isinstance(n, dict)]
    if not names and isinstance(job.get("nodes"), str):
        names = [job["nodes"]]  # a hostlist like "gpu[1-2]" fails the check below
    if not names or not all(isinstance(n, str) and NODE_RE.fullmatch(n) for n in names):
        return None
    return tuple(sorted(set(names)))  # type: ignore[arg-type]


def _gpus(job: dict[str, object]) -> int | None:
    tres = job.get("tres_alloc_str")
    if not isinstance(tres, str) or not tres:
        return None
    match = _GPU_TRES.search(tres)
    return int(match.group(1)) if match else 0


def _number(value: object) -> float | None:
    # 22.05 prints 1796159018; 23.11 and later {"set": true, "number": 1796159018}.
    if isinstance(value, dict):
        value = value.get("number") if value.get("set", True) else None
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) \
        else None


def _flag(value: object) -> bool | None:
    return value if isinstance(value, bool) else None


def _ident(job: dict[str, object]) -> SlurmJobId | None:
    try:
        return SlurmJobId.from_squeue(job)
    except ValueError:
        return None


def parse_squeue_json(text: str) -> dict[str, SlurmJob]:
    """``squeue --json`` -> every job it lists, by its own job id (each array task and
    het component has one; the array's unsplit remainder holds the array's id until
    its last task starts, which then takes it)."""
    try:
        jobs = json.loads(text)["jobs"]
        if not isinstance(jobs, list):
            raise TypeError("jobs is not a list")
    except (ValueError, KeyError, TypeError):
        raise ReportError("squeue --json printed something else than its JSON; check the "
                          "Slurm release (21.08 or later is needed)", EXIT_SLURM) from None
    listed = {}
    for job in jobs:
        if not isinstance(job, dict):
            continue
        jobid = str(job.get("job_id", ""))
        listed[jobid] = SlurmJob(
            jobid=jobid, user=str(job.get("user_name", "")),
            account=str(job.get("account", "")), partition=str(job.get("partition", "")),
            qos=str(job.get("qos", "")), name=str(job.get("name", "")),
            state=_state(job.get("job_state")), nodes=_nodes(job), gpus=_gpus(job),
            start=_number(job.get("start_time")), ident=_ident(job),
            comment=str(job.get("comment") or ""), requeue=_flag(job.get("requeue")),
            batch=_flag(job.get("batch_flag")))
    return listed
