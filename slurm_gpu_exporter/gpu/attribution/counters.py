"""Per job run and GPU counters, the busy time of users outside every job, and how both
are kept in the state dir.

A job run is a job id and its start time, so a job requeued onto the same node
starts new counters. Allocated time is wall-clock time held less the unknown time
(where the driver's samples may have been lost), so busy / allocated is a ratio of
measured time; allocated + unknown is the time held. Both, busy time and energy
only ever grow, and stay absent only where the GPU cannot measure them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from slurm_gpu_exporter.gpu.attribution.shares import UNATTRIBUTED, user_shares
from slurm_gpu_exporter.gpu.attribution.usage import Usage
from slurm_gpu_exporter.gpu.driver.integration import held_seconds
from slurm_gpu_exporter.jobs.job import Job

JobKey = tuple[str, float | None]  # (job id, start time): a requeued job is a new run


@dataclass
class JobGpuCounters:
    """One job run's counters on one GPU: what must only grow, plus the last gauges.

    busy and energy stay None only while the GPU has never measured them (not
    supported); once they hold a total, nothing sets them back to None.
    """

    gpu: str
    held: float = 0.0  # wall seconds the job held the GPU
    window: float = 0.0  # seconds covered by the driver's samples while held
    busy: float | None = None
    energy: float | None = None
    peak: int = 0
    held_until: float | None = None  # wall time up to which ``held`` is counted
    fresh: bool = True  # no sample window counted yet: the first is trimmed to the start
    utilization: float | None = None
    memory: int = 0
    processes: int = 0
    activity: dict[str, float] = field(default_factory=dict)  # GPM activity seconds by name
    unknown: float = 0.0  # seconds held where the driver's samples may have been lost
    # What slowed or hit the GPU while held (job_errors.py): "throttle:power" seconds,
    # "xid:79", "ecc:corrected", ... counts; and when each Xid code was last seen.
    health: dict[str, float] = field(default_factory=dict)
    xid_last: dict[str, float] = field(default_factory=dict)

    @property
    def allocated(self) -> float:
        # Measured time held. Never below the sampled window, so that busy / allocated
        # stays <= 1 where the driver's clock runs a little ahead of the wall clock.
        # It only grows: each poll's unknown time is at most the time it adds to held.
        return max(self.held - self.unknown, self.window)

    def hold(self, now: float, start: float | None, first_poll: float, window: float,
             unknown: float = 0.0) -> None:
        """Count wall time (and the sampled window) for a job that holds the GPU, and the
        part of it that nothing measured (``unknown``: samples lost), which stays out of
        allocated and busy time, counted on its own."""
        added = held_seconds(self.held_until, start, first_poll, now)
        self.held += added
        self.held_until = now
        self.window += window
        # At most what the poll held beyond its sampled window: driver and host clocks
        # differ by a sample period or so, and measured time comes first.
        self.unknown += min(max(0.0, unknown), max(0.0, added - window))

    def accrue(self, *, window: float, busy: float | None, energy: float | None,
               memory: int, processes: int) -> None:
        """Add one poll's use. None: the GPU cannot measure it, which leaves a total
        already counted as it is."""
        if busy is not None:
            self.busy = (self.busy or 0.0) + busy
            if window > 0:
                self.utilization = busy / window
        if energy is not None:
            self.energy = (self.energy or 0.0) + energy
        self.memory = memory
        self.peak = max(self.peak, memory)
        self.processes = processes

    def add_activity(self, seconds: Mapping[str, float]) -> None:
        """Add one GPM interval's activity seconds (see gpu/attribution/activity.py)."""
        for name, amount in seconds.items():
            self.activity[name] = self.activity.get(name, 0.0) + amount

    def add_health(self, key: str, amount: float) -> None:
        """Add to one of the health counters (created at 0: its series starts)."""
        self.health[key] = self.health.get(key, 0.0) + amount

    def to_state(self) -> list[Any]:
        return [self.gpu, self.held, self.window, self.busy, self.energy, self.peak,
                self.held_until, self.activity, self.unknown, self.health, self.xid_last]

    @classmethod
    def from_state(cls, data: Any) -> JobGpuCounters | None:
        def opt(x: Any) -> float | None:
            return None if x is None else float(x)

        try:
            activity: Any = {}
            unknown: Any = 0.0
            health: Any = {}
            xid_last: Any = {}
            if len(data) == 5:  # before 0.2: one allocated total, no time held until
                gpu, allocated, busy, energy, peak = data
                held = window = float(allocated)
                held_until = None
            elif len(data) == 7:  # before GPM activity
                gpu, held, window, busy, energy, peak, held_until = data
            elif len(data) == 8:  # before unknown time
                gpu, held, window, busy, energy, peak, held_until, activity = data
            elif len(data) == 9:  # before throttling and errors
                gpu, held, window, busy, energy, peak, held_until, activity, unknown = data
            else:
                (gpu, held, window, busy, energy, peak, held_until, activity, unknown, health,
                 xid_last) = data
            return cls(str(gpu), float(held), float(window), opt(busy), opt(energy),
                       int(peak), opt(held_until), fresh=False,
                       activity={str(n): float(v) for n, v in dict(activity).items()},
                       unknown=float(unknown),
                       health={str(n): float(v) for n, v in dict(health).items()},
                       xid_last={str(n): float(v) for n, v in dict(xid_last).items()})
        except (TypeError, ValueError):
            return None


def save_job_counters(counters: dict[JobKey, dict[str, JobGpuCounters]]) -> list[Any]:
    """The state-dir form: [job id, start time, {uuid: counters}] per job run."""
    return [[jobid, start, {uuid: c.to_state() for uuid, c in per.items()}]
            for (jobid, start), per in counters.items()]


def load_job_counters(data: dict[str, Any]) -> dict[JobKey, dict[str, JobGpuCounters]]:
    """Job runs' counters from a saved state; entries it cannot read are left out.

    State of earlier versions ("counters", by job id alone) comes back with no start
    time: the sampler gives it to the job of that id it sees first.
    """
    old, new = data.get("counters"), data.get("job_counters")
    runs: list[tuple[Any, Any, Any]] = [
        (jobid, None, per) for jobid, per in old.items()] if isinstance(old, dict) else []
    if isinstance(new, list):
        runs += [tuple(r) for r in new if isinstance(r, list) and len(r) == 3]
    out: dict[JobKey, dict[str, JobGpuCounters]] = {}
    for jobid, start, per in runs:
        if not isinstance(per, dict) or not isinstance(start, int | float | None):
            continue
        for uuid, raw in per.items():
            counter = JobGpuCounters.from_state(raw)
            if counter is not None:
                key = (str(jobid), None if start is None else float(start))
                out.setdefault(key, {})[str(uuid)] = counter
    return out


class CounterStore:
    """Every job run's counters by GPU UUID, and busy seconds of users outside every job
    by (GPU UUID, user): the totals that must survive a restart of the agent."""

    def __init__(self) -> None:
        self.runs: dict[JobKey, dict[str, JobGpuCounters]] = {}  # job run -> uuid -> counters
        self.unattributed_busy: dict[tuple[str, str], float] = {}  # (uuid, user) -> s

    def of_run(self, key: JobKey) -> dict[str, JobGpuCounters] | None:
        """A job run's counters by GPU UUID, None while it has none."""
        per_run = self.runs.get(key)
        if per_run is None and (key[0], None) in self.runs:
            # Saved by an agent that keyed counters by job id alone: this job's.
            per_run = self.runs[key] = self.runs.pop((key[0], None))
        return per_run

    def counter(self, key: JobKey, uuid: str, gpu: str) -> JobGpuCounters:
        """A job run's counter on one GPU, created at 0 on first use."""
        per_run = self.of_run(key)
        if per_run is None:
            per_run = self.runs[key] = {}
        counter = per_run.get(uuid)
        if counter is None:
            counter = per_run[uuid] = JobGpuCounters(gpu=gpu)
        return counter

    def held_across(self, jobs: Iterable[Job], uuid: str, since: float) -> set[str]:
        """The ids of ``jobs`` whose counters on the GPU were held at wall time ``since``
        or later: the jobs that held it before a gap up to now."""
        out = set()
        for job in jobs:
            c = (self.of_run((job.jobid, job.start_time)) or {}).get(uuid)
            if c is not None and c.held_until is not None and c.held_until >= since - 1e-3:
                out.add(job.jobid)
        return out

    def count_unattributed_busy(self, uuid: str, usage: Usage, busy: float | None,
                                busy_shares: dict[str, float]) -> dict[str, float]:
        """Add one poll's busy time of the users with processes outside every job on a
        GPU (split by their processes' samples); their totals there."""
        if busy is None:
            return {}
        outside = busy * busy_shares.get(UNATTRIBUTED, 0.0)
        for user, share in user_shares(usage.unattributed_weight, usage.unattributed).items():
            self.add_unattributed_busy(uuid, user, outside * share)
        return {user: self.unattributed_busy.get((uuid, user), 0.0)
                for user in usage.unattributed}

    def add_unattributed_busy(self, uuid: str, user: str, seconds: float) -> float:
        """Add busy seconds of a user outside every job; the user's new total on the GPU."""
        total = self.unattributed_busy[(uuid, user)] = (
            self.unattributed_busy.get((uuid, user), 0.0) + seconds)
        return total

    def forget_runs(self, runs: set[JobKey], tracked: set[str]) -> None:
        """Drop the runs not in ``runs``; counters saved without a start time are kept
        while a job of their id is tracked (it has not been seen running yet)."""
        for key in [k for k in self.runs
                    if k not in runs and not (k[1] is None and k[0] in tracked)]:
            del self.runs[key]

    def prune_gpus(self, present: set[str]) -> None:
        for key in [k for k in self.unattributed_busy if k[0] not in present]:
            del self.unattributed_busy[key]

    def export_state(self) -> dict[str, Any]:
        return {
            "job_counters": save_job_counters(self.runs),
            "unattributed_busy": [[uuid, user, v]
                                  for (uuid, user), v in self.unattributed_busy.items()],
        }

    def import_state(self, data: dict[str, Any]) -> None:
        for key, per in load_job_counters(data).items():
            self.runs.setdefault(key, {}).update(per)
        rows = data.get("unattributed_busy")
        for row in rows if isinstance(rows, list) else ():
            if isinstance(row, list) and len(row) == 3 and isinstance(row[2], int | float):
                self.unattributed_busy[(str(row[0]), str(row[1]))] = float(row[2])
