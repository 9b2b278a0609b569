"""A Slurm job's identity: its id, array job and task, het job and offset, SLUID.

One type for every product. Slurm gives each array task and each het component its
own job id, yet a command that names the array's or the het leader's id acts on all of
them: the array's id stays on the last task Slurm starts, and ``scancel <array id>`` or
``scontrol update JobId=<array id>`` reach every task. So ``target`` is the one string
that Slurm resolves to exactly this job (``A_T`` for an array task), or to the whole het
job for a het component, which is only ever acted on as a whole; ``display`` is the id as
users know it (``1234_5``, ``1234+1``).

Built from ``squeue --json`` (22.05 prints the array and het fields as ints, 0 for none;
23.11 and later as ``{"set": …, "number": …}``) or from the agent's labels and spool
fields (strings, "" for none). Every field is checked against Slurm's grammar: a value
that is not one is refused (ValueError), never passed on.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from slurm_gpu_exporter.model.ids import NO_VAL, is_job_id, is_sluid, is_slurm_num

__all__ = ["SlurmJobId"]


@dataclass(frozen=True)
class SlurmJobId:
    """Who a Slurm job is; "" where a field does not apply (no array, no het job)."""

    job_id: str
    array_job_id: str = ""
    array_task_id: str = ""  # "" with an array_job_id: the array's pending tasks, unsplit
    het_job_id: str = ""
    het_job_offset: str = ""
    sluid: str = ""  # Slurm 26.05+

    def __post_init__(self) -> None:
        for name in ("job_id", "array_job_id", "het_job_id"):
            value = getattr(self, name)
            if (value or name == "job_id") and not is_job_id(value):
                raise ValueError(f"{name} {value[:40]!r} is not a Slurm job id")
        for name in ("array_task_id", "het_job_offset"):
            value = getattr(self, name)
            if value and not (is_slurm_num(value) and int(value) < NO_VAL):
                raise ValueError(f"{name} {value[:40]!r} is not a Slurm number")
        if self.sluid and not is_sluid(self.sluid):
            raise ValueError(f"sluid {self.sluid[:40]!r} is not a SLUID")
        if self.array_task_id and not self.array_job_id:
            raise ValueError("an array task id without its array job id")
        if bool(self.het_job_id) != bool(self.het_job_offset):
            raise ValueError("a het job id without its offset, or an offset without its id")
        if self.array_job_id and self.het_job_id:
            raise ValueError("both an array job and a het job (Slurm has no het arrays)")

    @property
    def is_array_task(self) -> bool:
        """One task of a job array, split off with its own job id."""
        return bool(self.array_task_id)

    @property
    def is_array_remainder(self) -> bool:
        """The record of an array's tasks not yet split off: its id names the whole array."""
        return bool(self.array_job_id) and not self.array_task_id

    @property
    def is_het_component(self) -> bool:
        """One component of a heterogeneous job (the leader too): acted on only as a whole."""
        return bool(self.het_job_id)

    @property
    def target(self) -> str | None:
        """What to hand ``scancel``/``scontrol update JobId=``: ``A_T`` for an array task,
        the het leader's id for a het component (the whole het job), the id of a plain
        job; None for an array's unsplit remainder, which no id names alone."""
        if self.is_array_task:
            return f"{self.array_job_id}_{self.array_task_id}"
        if self.is_array_remainder:
            return None
        return self.het_job_id or self.job_id

    @property
    def display(self) -> str:
        """The id as users know it: ``1234_5``, ``1234+1``, ``1234``."""
        if self.is_array_task:
            return f"{self.array_job_id}_{self.array_task_id}"
        if self.is_het_component:
            return f"{self.het_job_id}+{self.het_job_offset}"
        return self.job_id

    @classmethod
    def from_squeue(cls, job: Mapping[str, object]) -> SlurmJobId:
        """The identity in one job of ``squeue --json``; ValueError when it is not one."""
        job_id = _number(job.get("job_id"))
        if job_id is None:
            raise ValueError("no job_id")
        array_job = _number(job.get("array_job_id")) or None  # 22.05: 0 for none
        het_job = _number(job.get("het_job_id")) or None
        task = _number(job.get("array_task_id")) if array_job else None
        offset = _number(job.get("het_job_offset")) if het_job else None
        if het_job and offset is None:
            raise ValueError("a het job component without its offset")
        sluid = job.get("sluid")
        step = job.get("step_id")
        if not sluid and isinstance(step, Mapping):  # where 26.05 puts it in squeue's JSON
            sluid = step.get("sluid")
        return cls(str(job_id), _text(array_job), _text(task), _text(het_job),
                   _text(offset), sluid if isinstance(sluid, str) else "")

    @classmethod
    def from_labels(cls, labels: Mapping[str, str]) -> SlurmJobId:
        """The identity in the agent's ``slurm_job_info`` labels (``jobid``,
        ``array_job_id``, ``array_task_id``) or a spool record's fields of those names;
        ValueError when they do not make one."""
        array_job = labels.get("array_job_id", "")
        array_job = "" if array_job == "0" else array_job  # 0 is Slurm's "none"
        # A task id alone says nothing about which array; older agents left the array
        # out where Slurm printed none.
        task = labels.get("array_task_id", "") if array_job else ""
        return cls(labels.get("jobid", ""), array_job, task, sluid=labels.get("sluid", ""))


def _number(value: object) -> int | None:
    """A number as ``squeue --json`` prints it: 22.05 a plain int, 23.02+ a dict with
    ``set``; None where it is not set (absent, null, NO_VAL, INFINITE, ``set`` false).
    ValueError for anything else: a shape we do not know must not read as "none"."""
    if isinstance(value, Mapping):
        if "set" not in value:
            raise ValueError("a number without its 'set' flag")
        if not value["set"] or value.get("infinite", False):
            return None
        value = value.get("number")
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{str(value)[:40]!r} is not a Slurm number")
    return None if value >= NO_VAL else value


def _text(value: int | None) -> str:
    return "" if value is None else str(value)
