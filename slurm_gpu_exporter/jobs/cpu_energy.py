"""CPU package and DRAM energy shared among the jobs by their CPU time.

In each sample, each domain's energy (all sockets together) goes to the jobs in
proportion to the CPU time each used during the sample, out of the CPU time the whole
node was busy (``/proc/stat``); the rest (idle power, processes outside every job) goes
to "outside jobs". So the jobs' shares and the outside share add up to what RAPL
measured. The split is over the node, not per socket: a job's CPU time per socket is
not in its cgroup (v2 has no per-CPU figure).

A share is an estimate; the node's totals are the measurement. Counters are kept per
run of a job (job id and start time) and carried over restarts in the state dir.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slurm_gpu_exporter.exposition.snapshot import CpuEnergySample, JobCpuEnergySample, JobSample
from slurm_gpu_exporter.jobs.source import SampleContext, SourceDefaults
from slurm_gpu_exporter.node.powercap import DOMAINS, PowercapReader, busy_cpu_seconds
from slurm_gpu_exporter.node.source_health import SourceErrors

RunKey = tuple[str, float | None]
REDISCOVER_SAMPLES = 60  # while no zone is found, look again this often


@dataclass(frozen=True)
class CpuEnergyPart:
    """What the CPU energy source adds to a snapshot."""

    up: bool
    jobs: tuple[JobCpuEnergySample, ...] = ()
    sockets: tuple[CpuEnergySample, ...] = ()
    outside_jobs: tuple[tuple[str, float], ...] = ()  # (domain, joules)


def forget_gone_runs(jobs: dict[RunKey, Any], unclaimed: dict[RunKey, int],
                     alive: set[RunKey]) -> None:
    """Drop from ``jobs`` the runs not ``alive``; a run restored from the state dir
    (``unclaimed``: samples of grace left) stays until its grace runs out."""
    for key in alive:
        unclaimed.pop(key, None)
    for key in list(unclaimed):
        unclaimed[key] -= 1
        if unclaimed[key] <= 0:
            del unclaimed[key]
    for key in [k for k in jobs if k not in alive and k not in unclaimed]:
        del jobs[key]


class EnergySharer:
    """Pure bookkeeping: shares one sample's energy by CPU time, keeps the counters."""

    def __init__(self) -> None:
        self.jobs: dict[RunKey, dict[str, float]] = {}
        self.outside: dict[str, float] = dict.fromkeys(DOMAINS, 0.0)
        self._cpu_last: dict[RunKey, float] = {}
        # Runs restored from the state dir that no sample has shown yet -> samples left
        # (the tracker may need a few to find a job again after a restart).
        self.unclaimed: dict[RunKey, int] = {}

    def cpu_deltas(self, cpu_now: dict[RunKey, float]) -> dict[RunKey, float]:
        """Each run's CPU seconds since the last sample (0 on its first)."""
        deltas = {k: max(0.0, v - self._cpu_last.get(k, v)) for k, v in cpu_now.items()}
        self._cpu_last = dict(cpu_now)
        return deltas

    def share(self, energy: dict[str, float], cpu: dict[RunKey, float],
              busy_seconds: float) -> None:
        """Add ``energy`` (joules by domain) to the runs by ``cpu`` (seconds in the sample)
        out of ``busy_seconds`` of the node; what is left to outside jobs."""
        used = sum(cpu.values())
        whole = max(busy_seconds, used)
        for domain, joules in energy.items():
            given = 0.0
            if whole > 0:
                for key, seconds in cpu.items():
                    part = joules * seconds / whole
                    counters = self.jobs.setdefault(key, dict.fromkeys(DOMAINS, 0.0))
                    counters[domain] = counters.get(domain, 0.0) + part
                    given += part
            self.outside[domain] = self.outside.get(domain, 0.0) + joules - given

    def keep_only(self, alive: set[RunKey]) -> None:
        """Forget the runs that are gone (restored ones after a grace of samples)."""
        forget_gone_runs(self.jobs, self.unclaimed, alive)


class CpuEnergySource(SourceDefaults):
    """Reads RAPL each sample and shares it among the jobs; thread-confined to the sampler."""

    def __init__(self, reader: PowercapReader, proc_root: Path, errors: SourceErrors,
                 busy: Callable[[Path], float] = busy_cpu_seconds) -> None:
        self.reader = reader
        self.proc_root = proc_root
        self.errors = errors
        self.sharer = EnergySharer()
        self._busy = busy
        self._busy_last: float | None = None
        self._totals: dict[tuple[str, str], float] = {}  # (socket, domain) -> joules
        self._until_rediscover = 0
        self._problems: list[str] = []  # what the last look for zones met

    # As a source of the sample: after the cgroup figures, whose CPU time shares it.
    name = "powercap"
    health_names = ("powercap",)
    state_key = "cpu_energy"

    def take(self, ctx: SampleContext) -> CpuEnergyPart:
        return self.sample(ctx.parts.get("cgroup") or [])

    def failed_part(self) -> CpuEnergyPart:
        return CpuEnergyPart(up=False)

    def up(self, part: CpuEnergyPart) -> bool:
        return part.up  # its zones found and read

    def snapshot_fields(self, part: CpuEnergyPart) -> dict[str, Any]:
        return {"powercap_up": part.up, "job_cpu_energy": part.jobs,
                "cpu_energy": part.sockets, "cpu_energy_outside_jobs": part.outside_jobs}

    def sample(self, jobs: list[JobSample]) -> CpuEnergyPart:
        if not self.reader.zones:
            if self._until_rediscover <= 0:
                self._until_rediscover = REDISCOVER_SAMPLES
                problems = self.reader.rediscover()
                if problems != self._problems:  # the same absence is counted once
                    for problem in problems:
                        self.errors.count("powercap", problem)
                self._problems = problems
            self._until_rediscover -= 1
            if not self.reader.zones:
                return CpuEnergyPart(up=False)
        readings = self.reader.read()
        up = True
        energy: dict[str, float] = {}
        for r in readings:
            if r.error:
                up = False
                self.errors.count("powercap", r.error)
            if r.joules is None:
                continue
            key = (r.zone.socket, r.zone.domain)
            self._totals[key] = self._totals.get(key, 0.0) + r.joules
            energy[r.zone.domain] = energy.get(r.zone.domain, 0.0) + r.joules
        cpu_now = {(s.job.jobid, s.job.start_time): s.cpu_seconds for s in jobs
                   if s.cpu_seconds is not None}
        deltas = self.sharer.cpu_deltas(cpu_now)
        busy_now = self._busy(self.proc_root)
        busy = 0.0 if self._busy_last is None else max(0.0, busy_now - self._busy_last)
        self._busy_last = busy_now
        self.sharer.share(energy, deltas, busy)
        self.sharer.keep_only({(s.job.jobid, s.job.start_time) for s in jobs})
        by_key = {(s.job.jobid, s.job.start_time): s.job for s in jobs}
        job_samples = tuple(
            JobCpuEnergySample(by_key[key], domain, joules)
            for key, counters in self.sharer.jobs.items()
            for domain, joules in counters.items() if key in by_key)
        sockets = tuple(CpuEnergySample(socket, domain, joules)
                        for (socket, domain), joules in sorted(self._totals.items()))
        return CpuEnergyPart(up=up, jobs=job_samples, sockets=sockets,
                             outside_jobs=tuple(sorted(self.sharer.outside.items())))

    def export_state(self) -> dict[str, Any]:
        return {"jobs": [[k[0], k[1], v] for k, v in self.sharer.jobs.items()]}

    def import_state(self, data: dict[str, Any]) -> None:
        for jobid, start, counters in data.get("jobs", []):
            if isinstance(counters, dict):
                key = (str(jobid), float(start) if isinstance(start, int | float) else None)
                self.sharer.jobs[key] = {d: float(v) for d, v in counters.items()
                                         if d in DOMAINS}
                self.sharer.unclaimed[key] = REDISCOVER_SAMPLES
