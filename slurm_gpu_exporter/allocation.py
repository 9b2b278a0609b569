"""Which GPUs a job holds, from what slurmd told the prolog.

``SLURM_JOB_GPUS`` holds Slurm's GPU indices (gres.conf order, which follows
device minor numbers, not NVML enumeration order). ``CUDA_VISIBLE_DEVICES`` may
hold the same indices or ``GPU-…``/``MIG-…`` UUIDs.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GpuAllocation:
    """GPUs a job holds: by UUID where slurmd gave UUIDs, else by Slurm index (minor)."""

    uuids: tuple[str, ...] = ()
    indices: tuple[int, ...] = ()

    @property
    def count(self) -> int:
        return len(self.uuids) or len(self.indices)


def parse_index_list(text: str) -> list[int]:
    """``0,2-3`` -> [0, 2, 3]; anything that is not an index list gives []."""
    result: list[int] = []
    for item in text.split(","):
        item = item.strip()
        lo, dash, hi = item.partition("-")
        if lo.isdigit() and hi.isdigit() and int(hi) >= int(lo):
            result.extend(range(int(lo), int(hi) + 1))
        elif lo.isdigit() and not dash:
            result.append(int(lo))
        elif item:
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
