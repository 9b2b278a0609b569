"""Per job run and GPU counters, and the small clock arithmetic they need.

A job run is a job id and its start time, so a job requeued onto the same node
starts new counters. Allocated time is wall-clock time held; busy time and
energy only ever grow, and stay absent only where the GPU cannot measure them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from slurm_gpu_exporter.gpu.backend import UtilSample

# Driver sample timestamps further than this from the wall clock are on another
# clock: they are still integrated, but never compared with a job's start.
CLOCK_TOLERANCE_S = 60.0

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

    @property
    def allocated(self) -> float:
        # Never below the sampled window, so that busy / allocated stays <= 1 even
        # where the driver's clock runs a little ahead of the wall clock.
        return max(self.held, self.window)

    def hold(self, now: float, start: float | None, first_poll: float, window: float) -> None:
        """Count wall time (and the sampled window) for a job that holds the GPU."""
        self.held += held_seconds(self.held_until, start, first_poll, now)
        self.held_until = now
        self.window += window

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

    def to_state(self) -> list[Any]:
        return [self.gpu, self.held, self.window, self.busy, self.energy, self.peak,
                self.held_until]

    @classmethod
    def from_state(cls, data: Any) -> JobGpuCounters | None:
        def opt(x: Any) -> float | None:
            return None if x is None else float(x)

        try:
            if len(data) == 5:  # before 0.2: one allocated total, no time held until
                gpu, allocated, busy, energy, peak = data
                held = window = float(allocated)
                held_until = None
            else:
                gpu, held, window, busy, energy, peak, held_until = data
            return cls(str(gpu), float(held), float(window), opt(busy), opt(energy),
                       int(peak), opt(held_until), fresh=False)
        except (TypeError, ValueError):
            return None


def held_seconds(held_until: float | None, start: float | None, first_poll: float,
                 now: float) -> float:
    """Wall seconds a held GPU adds to a job's allocated time at ``now``: since the last
    count, or for a new counter since the job's start (not before the agent's first
    poll, as nothing is known of earlier use), whether or not the driver had samples."""
    since = held_until if held_until is not None else max(start or now, first_poll)
    return max(0.0, now - since)


def clock_offset_s(samples: Iterable[UtilSample], now: float) -> float:
    """Seconds by which the newest driver sample is ahead of the wall clock (0 without one)."""
    newest = max((s.timestamp_us for s in samples), default=None)
    return 0.0 if newest is None else newest / 1e6 - now


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
