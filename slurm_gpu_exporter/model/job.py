"""One frozen description of a job, which every source fills by field name.

The prolog's spool record, Slurm's answer and the job the tracker reports each hold
(some of) these fields under these names; ``describe`` takes them from any of them, and
``filled_from`` merges two descriptions field by field. The snapshot's job and the
tracker's job are descriptions with a little more, so a new field added here reaches
the exposition without a copy in between.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, fields, replace
from typing import Any

from slurm_gpu_exporter.model.allocation import GpuAllocation, gpu_allocation

__all__ = ["GPU_FIELDS", "JobDescription", "describe"]

# What slurmd gave the prolog about the job's GPUs: kept as given, never filled from
# another source (the agent interprets them: GpuAllocation).
GPU_FIELDS = ("job_gpus", "cuda_visible_devices")


@dataclass(frozen=True)
class JobDescription:
    """What is known about one run of a job; "" or None where it is not known."""

    jobid: str
    uid: int | None = None
    user: str = ""
    account: str = ""
    partition: str = ""
    qos: str = ""
    cluster: str = ""
    name: str = ""
    array_job_id: str = ""
    array_task_id: str = ""
    job_gpus: str = ""  # SLURM_JOB_GPUS: Slurm's indices (device minors)
    cuda_visible_devices: str = ""  # indices or GPU-/MIG- UUIDs
    start_time: float | None = None  # the run's start: a requeued job starts again

    @functools.cached_property
    def allocation(self) -> GpuAllocation:
        """The GPUs the job holds on this node, parsed once per description: job stats
        and GPU attribution read the same one (the tracker hands out an unchanged job's
        same object every sample)."""
        return gpu_allocation(self.job_gpus, self.cuda_visible_devices)

    def filled_from(self, other: JobDescription, keep: tuple[str, ...] = ()) -> JobDescription:
        """This description with the fields it does not know taken from ``other``, except
        those named in ``keep``."""
        gaps = {
            name: value for name in _NAMES
            if name not in keep and getattr(self, name) in _UNKNOWN
            and (value := getattr(other, name)) not in _UNKNOWN
        }
        return replace(self, **gaps) if gaps else self


_UNKNOWN: tuple[Any, ...] = (None, "")
_NAMES = tuple(f.name for f in fields(JobDescription))


def describe(of: object, cls: type[JobDescription] = JobDescription, /,
             **more: Any) -> Any:
    """A ``cls`` from the fields of ``of`` (a spool record, Slurm's answer, a job) that
    carry a description field's name; ``more`` sets the rest of ``cls``'s fields."""
    values = {name: getattr(of, name) for name in _NAMES if hasattr(of, name)}
    values.update(more)
    return cls(**values)

