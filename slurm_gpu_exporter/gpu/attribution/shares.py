"""Who gets a GPU's busy time and energy (its shares among jobs and users): pure rules, no I/O.

- Which GPUs a job holds comes from its record: by UUID where slurmd gave
  ``GPU-…``/``MIG-…`` UUIDs, else by Slurm index = device minor number. Never by
  NVML enumeration order.
- A GPU used by one job (and nobody else) credits all its busy time to that job.
- A GPU used by several jobs (sharding, MPS, oversubscription) is split by the
  processes' own utilization samples; without samples, evenly among the jobs
  using it. The device value is never copied to each job.
- Busy time with no process to show for it goes to the job holding the GPU if
  there is exactly one, else stays unattributed.
- Energy follows the busy split; an idle GPU's energy goes to the jobs holding it.
- Busy time of processes outside every job is split among their users by the
  processes' samples, else evenly.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

from slurm_gpu_exporter.model.allocation import GpuAllocation

UNATTRIBUTED = ""  # key of usage by processes outside every job


@dataclass(frozen=True)
class GpuTarget:
    """A GPU or MIG instance a job can hold; ``gpu`` is its label ("0" or "0.3")."""

    gpu: str
    uuid: str
    minor: int | None
    is_mig: bool = False
    parent_uuid: str = ""


def held_targets(allocation: GpuAllocation, targets: Iterable[GpuTarget]) -> list[GpuTarget]:
    """The targets an allocation covers: by UUID when it has UUIDs, else by minor number."""
    targets = list(targets)
    if allocation.uuids:
        wanted = set(allocation.uuids)
        return [t for t in targets if t.uuid in wanted]
    wanted_minors = set(allocation.indices)
    return [t for t in targets if not t.is_mig and t.minor in wanted_minors]


def shares(
    users: Mapping[str, float],
    holders: Iterable[str],
) -> dict[str, float]:
    """Fractions (summing to 1, or empty) of one GPU's busy time per job key.

    ``users`` maps each job using the GPU (UNATTRIBUTED for processes outside
    jobs) to its weight: the sum of its processes' SM samples in the window.
    ``holders`` are the jobs the GPU is allocated to.
    """
    holders = list(holders)
    if not users:
        # Busy with no process to show (it exited between polls): the sole holder's.
        return {holders[0]: 1.0} if len(holders) == 1 else {UNATTRIBUTED: 1.0}
    if len(users) == 1:
        return {next(iter(users)): 1.0}
    total = sum(users.values())
    if total <= 0:
        return {key: 1.0 / len(users) for key in users}
    return {key: weight / total for key, weight in users.items()}


def energy_shares(busy_shares: Mapping[str, float], busy_seconds: float,
                  holders: Iterable[str], only: Collection[str] | None = None
                  ) -> dict[str, float]:
    """Fractions of one GPU's energy per job: by busy share, or evenly among holders when idle.

    ``only`` names the jobs that may take part (None: all): for the energy of a time
    the agent was down, the jobs that held the GPU on both sides of it. The parts of
    the others (jobs that started or ended meanwhile, processes outside every job) go
    to no job, as that time is in no other job's allocated time either.
    """
    if busy_seconds > 0:
        return {k: v for k, v in busy_shares.items()
                if k != UNATTRIBUTED and (only is None or k in only)}
    holders = [h for h in holders if only is None or h in only]
    return {key: 1.0 / len(holders) for key in holders} if holders else {}


# A MIG profile in an instance's name: "1g.10gb" (a GPU instance of 1 compute slice) or
# "1c.3g.40gb" (a compute instance of 1 slice inside a 3-slice GPU instance).
_MIG_PROFILE = re.compile(r"(?:(\d+)c\.)?(\d+)g\.\d+gb")


def mig_sm_fraction(instance_name: str, parent_name: str) -> float | None:
    """The share of a MIG-enabled GPU's SMs one instance has: its compute slices out of
    the GPU's (4 on an A30, 7 on every other MIG GPU so far); None where the name shows
    no profile. Slices without an instance leave their part of the energy to no job."""
    m = _MIG_PROFILE.search(instance_name)
    if m is None:
        return None
    slices = int(m.group(1) or m.group(2))
    total = 4 if "A30" in parent_name else 7
    return min(1.0, slices / total)


def user_shares(weights: Mapping[str, float], users: Iterable[str]) -> dict[str, float]:
    """Fractions per user of the busy time of processes outside every job: by the
    weight of their processes' samples, evenly where none has any."""
    users = list(users)
    total = sum(weights.get(u, 0.0) for u in users)
    if total <= 0:
        return {u: 1.0 / len(users) for u in users}
    return {u: weights.get(u, 0.0) / total for u in users}
