"""The node's energy from its power meter, and each job's estimated share of it.

The meter's power (watts, node/hwmon.py or node/power_command.py) is integrated over
the time between samples (trapezoids); an interval with a failed reading at either end
is not counted, so a meter that was down adds nothing rather than a guess.

In each interval the node's energy goes to the jobs in proportion to what the parts
that are measured say they used: each job's GPU energy plus its CPU package and DRAM
share (jobs/cpu_energy.py), out of all the GPUs' energy plus all of RAPL's. The rest
(fans, disks, network, power-supply losses, idle parts, processes outside jobs) goes to
"outside jobs", so the shares add up to what the meter measured. A share is an
estimate; the node's total is the measurement.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from slurm_gpu_exporter.exposition.snapshot import (
    CpuEnergySample,
    GpuSample,
    JobCpuEnergySample,
    JobGpuSample,
    JobInfo,
    JobNodeEnergySample,
)
from slurm_gpu_exporter.jobs.cpu_energy import RunKey, forget_gone_runs
from slurm_gpu_exporter.jobs.source import SampleContext, SourceDefaults
from slurm_gpu_exporter.node.hwmon import MeterDown
from slurm_gpu_exporter.node.source_health import SourceErrors

RESTORED_GRACE = 60  # samples a run restored from the state dir may take to show again


class PowerMeter(Protocol):
    """A node power meter: watts now, or MeterDown."""

    def read(self) -> float: ...
    def describe(self) -> str: ...


@dataclass(frozen=True)
class NodeEnergyPart:
    """What the node energy source adds to a snapshot."""

    up: bool
    power_watts: float | None = None
    energy_joules: float | None = None  # None until the meter's first reading
    jobs: tuple[JobNodeEnergySample, ...] = ()
    outside_jobs_joules: float | None = None


@dataclass(frozen=True)
class MeasuredParts:
    """What the measured parts of the node say for one sample (counters since start)."""

    job_gpu: tuple[JobGpuSample, ...] = ()
    gpus: tuple[GpuSample, ...] = ()
    job_cpu: tuple[JobCpuEnergySample, ...] = ()
    cpu: tuple[CpuEnergySample, ...] = ()


class CounterDeltas:
    """How much each of a set of counters grew since the last call (0 on first sight:
    a counter restored from the state dir is not energy of this interval)."""

    def __init__(self) -> None:
        self._last: dict[Any, float] = {}

    def step(self, now: dict[Any, float]) -> dict[Any, float]:
        deltas = {k: max(0.0, v - self._last.get(k, v)) for k, v in now.items()}
        self._last = dict(now)
        return deltas


def _sum_by(items: dict[Any, float], key: Any) -> dict[Any, float]:
    out: dict[Any, float] = {}
    for k, v in items.items():
        out[key(k)] = out.get(key(k), 0.0) + v
    return out


class NodeEnergySource(SourceDefaults):
    """Integrates the meter each sample and shares the energy; thread-confined to the
    sampler."""

    def __init__(self, meter: PowerMeter, errors: SourceErrors) -> None:
        self.meter = meter
        self.errors = errors
        self.total = 0.0
        self.outside = 0.0
        self.jobs: dict[RunKey, float] = {}
        self.unclaimed: dict[RunKey, int] = {}
        self._last: tuple[float, float] | None = None  # (time, watts) of the last good read
        self._absence = ""  # the absence last counted
        self.measured = False  # whether the meter ever gave a reading (else no totals)
        self._gpu_jobs = CounterDeltas()
        self._gpus = CounterDeltas()
        self._cpu_jobs = CounterDeltas()
        self._cpu = CounterDeltas()

    # As a source of the sample: after the GPUs and RAPL, whose energy weighs the shares.
    name = "nodepower"
    health_names = ("nodepower",)
    state_key = "node_energy"

    def take(self, ctx: SampleContext) -> NodeEnergyPart:
        job_samples = ctx.parts.get("cgroup") or []
        gpu, cpu = ctx.parts.get("nvml"), ctx.parts.get("powercap")
        measured = MeasuredParts(job_gpu=gpu.job_gpus if gpu else (),
                                 gpus=gpu.gpus if gpu else (),
                                 job_cpu=cpu.jobs if cpu else (),
                                 cpu=cpu.sockets if cpu else ())
        return self.sample(ctx.now, [s.job for s in job_samples], measured)

    def failed_part(self) -> NodeEnergyPart:
        return NodeEnergyPart(up=False)

    def up(self, part: NodeEnergyPart) -> bool:
        return part.up  # the meter read

    def snapshot_fields(self, part: NodeEnergyPart) -> dict[str, Any]:
        return {"node_power_up": part.up, "node_power_watts": part.power_watts,
                "node_energy_joules": part.energy_joules, "job_node_energy": part.jobs,
                "node_energy_outside_jobs": part.outside_jobs_joules}

    def sample(self, now: float, running: list[JobInfo], parts: MeasuredParts
               ) -> NodeEnergyPart:
        weights, whole = self._weights(parts)
        try:
            watts = self.meter.read()
        except MeterDown as exc:
            message = f"{self.meter.describe()}: {exc}"
            if not exc.absent or message != self._absence:  # an absence counts once
                self.errors.count("nodepower", message)
            self._absence = message if exc.absent else ""
            self._last = None  # the next interval starts at the next good read
            return self._part(False, None, running)
        if self._last is not None and now > self._last[0]:
            joules = (self._last[1] + watts) / 2 * (now - self._last[0])
            self.share(joules, weights, whole)
        self._last = (now, watts)
        self._absence = ""
        self.measured = True
        return self._part(True, watts, running)

    def share(self, joules: float, weights: dict[RunKey, float], whole: float) -> None:
        """Add ``joules`` to the runs by ``weights`` out of ``whole`` (the measured parts'
        energy in the interval); the rest to outside jobs."""
        self.total += joules
        given = 0.0
        # The parts can read more than the meter over a short interval (their counters
        # and the meter are not read at one instant): never give out more than measured.
        whole = max(whole, sum(weights.values()))
        if whole > 0:
            for key, used in weights.items():
                part = joules * used / whole
                self.jobs[key] = self.jobs.get(key, 0.0) + part
                given += part
        self.outside += joules - given

    def _weights(self, parts: MeasuredParts) -> tuple[dict[RunKey, float], float]:
        """Each run's measured energy in this interval, and all the parts' energy."""
        gpu_jobs = self._gpu_jobs.step({(s.job.jobid, s.job.start_time, s.gpu): s.energy_joules
                                        for s in parts.job_gpu if s.energy_joules is not None})
        gpus = self._gpus.step({g.uuid: g.energy_joules for g in parts.gpus
                                if g.energy_joules is not None and not g.parent_uuid})
        cpu_jobs = self._cpu_jobs.step({(s.job.jobid, s.job.start_time, s.domain): s.joules
                                        for s in parts.job_cpu})
        cpu = self._cpu.step({(c.socket, c.domain): c.joules for c in parts.cpu})
        weights = _sum_by(gpu_jobs, lambda k: (k[0], k[1]))
        for key, joules in _sum_by(cpu_jobs, lambda k: (k[0], k[1])).items():
            weights[key] = weights.get(key, 0.0) + joules
        return weights, sum(gpus.values()) + sum(cpu.values())

    def _part(self, up: bool, watts: float | None, running: list[JobInfo]) -> NodeEnergyPart:
        alive = {(j.jobid, j.start_time): j for j in running}
        forget_gone_runs(self.jobs, self.unclaimed, set(alive))
        return NodeEnergyPart(
            up=up, power_watts=watts, energy_joules=self.total if self.measured else None,
            jobs=tuple(JobNodeEnergySample(alive[k], joules)
                       for k, joules in self.jobs.items() if k in alive),
            outside_jobs_joules=self.outside if self.measured else None)

    def export_state(self) -> dict[str, Any]:
        if not self.measured:
            return {}
        return {"total": self.total, "outside": self.outside,
                "jobs": [[k[0], k[1], v] for k, v in self.jobs.items()]}

    def import_state(self, data: dict[str, Any]) -> None:
        if "total" in data:
            self.measured = True
        self.total = float(data.get("total", 0.0))
        self.outside = float(data.get("outside", 0.0))
        for jobid, start, joules in data.get("jobs", []):
            key = (str(jobid), float(start) if isinstance(start, int | float) else None)
            self.jobs[key] = float(joules)
            self.unclaimed[key] = RESTORED_GRACE
