"""Which GPUs a job holds, from what slurmd told the prolog.

``SLURM_JOB_GPUS`` holds Slurm's GPU indices (gres.conf order, which follows
device minor numbers, not NVML enumeration order). ``CUDA_VISIBLE_DEVICES`` may
hold the same indices or ``GPU-…``/``MIG-…`` UUIDs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class GpuAllocation:
    """GPUs a job holds: by UUID where slurmd gave UUIDs, else by Slurm index (minor)."""

    uuids: tuple[str, ...] = ()
    indices: tuple[int, ...] = ()

    @property
    def count(self) -> int:
        return len(self.uuids) or len(self.indices)


# No node has this many GPUs: a larger index, or a longer list, is garbage, not a range
# to build (as parse_cpu_list bounds CPU lists).
MAX_GPU_INDEX = 1023
# ASCII digits only: "²".isdigit() is True, and int("²") raises.
_INDEX = re.compile(r"[0-9]{1,4}")


def parse_index_list(text: str) -> list[int]:
    """``0,2-3`` -> [0, 2, 3]; anything that is not a list of ASCII indices up to
    MAX_GPU_INDEX gives [] (never raises: the text comes from a job's environment)."""
    result: list[int] = []
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        lo, dash, hi = item.partition("-")
        if not _INDEX.fullmatch(lo) or (dash and not _INDEX.fullmatch(hi)):
            return []
        first = int(lo)
        last = int(hi) if dash else first
        if last < first or last > MAX_GPU_INDEX:
            return []
        result.extend(range(first, last + 1))
        if len(result) > MAX_GPU_INDEX + 1:
            return []
    return result


def gpu_allocation(job_gpus: str, cuda_visible_devices: str) -> GpuAllocation:
    """The job's GPUs: UUIDs from CUDA_VISIBLE_DEVICES when it holds them, else indices."""
    visible = [v.strip() for v in cuda_visible_devices.split(",") if v.strip()]
    uuids = tuple(v for v in visible if v.startswith(("GPU-", "MIG-")))
    if uuids:
        return GpuAllocation(uuids=uuids)
    indices = parse_index_list(job_gpus)
    if not indices and cuda_visible_devices != "NoDevFiles":
        indices = parse_index_list(cuda_visible_devices)
    return GpuAllocation(indices=tuple(indices))
