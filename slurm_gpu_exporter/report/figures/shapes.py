"""What a report is made of: per-job usage over a window, and a job's detail per node and GPU.

Plain dataclasses filled by ``queries`` and read by the rules and the renderers.
Every derived figure (ratios, GPU-hours, waste) is computed here, once.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from slurm_gpu_exporter.model.slurm_id import SlurmJobId
from slurm_gpu_exporter.report.figures.gpu_events import GpuFault, Throttle
from slurm_gpu_exporter.report.figures.window import Window


@dataclass
class JobUsage:
    """One job over the window, summed over its nodes and GPUs."""

    jobid: str
    user: str = ""
    account: str = ""
    partition: str = ""
    name: str = ""
    cluster: str = ""
    gpus: int = 0
    allocated_s: float = 0.0  # GPU-seconds held in the window and measured
    busy_s: float = 0.0  # GPU-seconds busy in the window
    idle_gpus: int = 0  # GPUs held in the window and never busy
    gpu_memory_peak: float | None = None  # bytes, the largest of its GPUs
    start: float | None = None
    end: float | None = None  # None while running
    # SM activity (NVML GPM): seconds, and the GPU-seconds held on GPUs that measure it
    sm_active_s: float | None = None
    gpm_allocated_s: float = 0.0
    # tensor-core and DRAM-bandwidth activity (GPM), over the same GPU-seconds
    tensor_active_s: float | None = None
    dram_active_s: float | None = None
    unknown_s: float = 0.0  # GPU-seconds held where the driver's samples may have been lost
    # slurm_job_info's array labels: "" for a plain job (or where the agent did not know)
    array_job_id: str = ""
    array_task_id: str = ""
    # GPU-seconds the GPUs were held back by their most frequent slowing reason (low-util)
    slowed_s: float | None = None
    slowed_reason: str = ""
    # figures of figures/table.py that have no field of their own, by their field name;
    # None until one is set (a dict each of thousands of jobs, nodes and GPUs cost GC time)
    more: dict[str, float | None] | None = None

    @property
    def shown(self) -> str:
        """The job as users know it: ``1234_5`` for an array task (sacct's JobID), else
        its id; labels that are not Slurm's ids show the bare id."""
        try:
            return SlurmJobId.from_labels({"jobid": self.jobid,
                                           "array_job_id": self.array_job_id,
                                           "array_task_id": self.array_task_id}).display
        except ValueError:
            return self.jobid

    @property
    def gpu_hours(self) -> float:
        return self.allocated_s / 3600

    @property
    def busy_ratio(self) -> float | None:
        """Mean GPU utilization: busy / allocated; None when nothing was held."""
        if self.allocated_s <= 0:
            return None
        return min(1.0, self.busy_s / self.allocated_s)

    @property
    def wasted_gpu_hours(self) -> float:
        return max(0.0, self.allocated_s - self.busy_s) / 3600

    @property
    def slowed_ratio(self) -> float | None:
        """The share of the busy GPU-seconds the top slowing reason took."""
        return _share(self.slowed_s, self.busy_s)

    @property
    def sm_active_ratio(self) -> float | None:
        """Mean SM activity over the time held on GPUs with GPM; None without any."""
        return _share(self.sm_active_s, self.gpm_allocated_s)

    @property
    def tensor_active_ratio(self) -> float | None:
        return self.activity_ratio("tensor_active_s")

    @property
    def dram_active_ratio(self) -> float | None:
        return self.activity_ratio("dram_active_s")

    def activity_ratio(self, attr: str) -> float | None:
        """A GPM activity (a figure's field, ``tensor_active_s``) over the time held on
        the GPUs that measure it."""
        return _share(getattr(self, attr), self.gpm_allocated_s)


def _share(part: float | None, whole: float) -> float | None:
    """``part / whole`` capped at 1; None when ``part`` was not measured."""
    if part is None or whole <= 0:
        return None
    return min(1.0, part / whole)


@dataclass
class Total:
    """Sums over a group of jobs (a user, an account)."""

    key: str
    jobs: int = 0
    gpu_hours: float = 0.0
    busy_gpu_hours: float = 0.0
    wasted_gpu_hours: float = 0.0

    @property
    def busy_ratio(self) -> float | None:
        return self.busy_gpu_hours / self.gpu_hours if self.gpu_hours > 0 else None


def totals(jobs: list[JobUsage], attr: str) -> list[Total]:
    """Per-``attr`` (user or account) sums, most wasteful first."""
    groups: dict[str, Total] = {}
    for job in jobs:
        key = getattr(job, attr) or "(none)"
        total = groups.setdefault(key, Total(key))
        total.jobs += 1
        total.gpu_hours += job.gpu_hours
        total.busy_gpu_hours += job.busy_s / 3600
        total.wasted_gpu_hours += job.wasted_gpu_hours
    return sorted(groups.values(), key=lambda t: (-t.wasted_gpu_hours, t.key))


@dataclass
class LowUtilReport:
    """``low-util``: flagged jobs, sorted by waste, with per-user and per-account totals."""

    window: Window
    threshold: float
    jobs_seen: int
    flagged: list[JobUsage]
    queries: int = 0
    # jobid -> [(time, busy ratio)] for the flagged jobs charted in HTML
    timelines: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    # busy ratios of every job seen, for the distribution chart
    all_ratios: list[float] = field(default_factory=list)
    from_archive: int = 0  # jobs seen only in the job archive (--db), not in Prometheus
    notes: dict[str, str] = field(default_factory=dict)  # jobid -> slowed by its GPU

    @property
    def by_user(self) -> list[Total]:
        return totals(self.flagged, "user")

    @property
    def by_account(self) -> list[Total]:
        return totals(self.flagged, "account")


@dataclass
class GpuDetail:
    """One GPU of a job on one node."""

    gpu: str
    uuid: str
    allocated_s: float = 0.0  # measured time held (the agent leaves unknown time out)
    busy_s: float = 0.0
    memory_peak: float | None = None
    memory_total: float | None = None
    energy_j: float | None = None
    sm_active_s: float | None = None  # None: the GPU has no GPM (or shares it without MIG)
    tensor_active_s: float | None = None
    dram_active_s: float | None = None
    unknown_s: float | None = None  # held where the driver's samples may have been lost
    throttled: list[Throttle] = field(default_factory=list)  # by reason the GPU reports
    faults: list[GpuFault] = field(default_factory=list)  # only kinds that happened
    # figures of figures/table.py that have no field of their own, by their field name;
    # None until one is set (a dict each of thousands of jobs, nodes and GPUs cost GC time)
    more: dict[str, float | None] | None = None

    @property
    def busy_ratio(self) -> float | None:
        return min(1.0, self.busy_s / self.allocated_s) if self.allocated_s > 0 else None

    @property
    def sm_active_ratio(self) -> float | None:
        return _share(self.sm_active_s, self.allocated_s)

    @property
    def tensor_active_ratio(self) -> float | None:
        return self.activity_ratio("tensor_active_s")

    @property
    def dram_active_ratio(self) -> float | None:
        return self.activity_ratio("dram_active_s")

    def activity_ratio(self, attr: str) -> float | None:
        """A GPM activity (a figure's field) over the time held."""
        return _share(getattr(self, attr), self.allocated_s)

    @property
    def power_mean_w(self) -> float | None:
        """Mean power drawn while held: energy over the time held (measured or not)."""
        held = self.allocated_s + (self.unknown_s or 0.0)
        if self.energy_j is None or held <= 0:
            return None
        return self.energy_j / held


@dataclass
class NodeDetail:
    """A job on one node (one Prometheus target)."""

    node: str
    cpus: int | None = None
    cpu_s: float | None = None
    memory_peak: float | None = None
    memory_limit: float | None = None
    gpus: list[GpuDetail] = field(default_factory=list)
    cpu_energy_j: float | None = None  # CPU package and DRAM (RAPL), the job's share
    target: str = ""  # the Prometheus target (instance) it came from; "" from the archive
    # figures of figures/table.py that have no field of their own, by their field name;
    # None until one is set (a dict each of thousands of jobs, nodes and GPUs cost GC time)
    more: dict[str, float | None] | None = None


@dataclass
class Accounting:
    """What Slurm accounting adds (sacct), where the site has it."""

    state: str = ""
    time_limit_s: float | None = None
    requested_memory: float | None = None  # bytes for the whole job
    cpus: int | None = None
    nodes: int | None = None
    start: float | None = None
    end: float | None = None
    exit_code: str = ""  # "0:0", "1:0" (code:signal)
    account: str = ""
    qos: str = ""
    requested_gpus: int | None = None


@dataclass
class JobDetail:
    """``job JOBID``: the job's header, its nodes and GPUs, and its notes."""

    usage: JobUsage
    nodes: list[NodeDetail]
    accounting: Accounting | None
    now: float
    notes: list[str] = field(default_factory=list)
    gco2e_per_kwh: float | None = None  # the configured emissions factor, if any

    @property
    def running(self) -> bool:
        if self.accounting and self.accounting.state:
            return self.accounting.state in ("RUNNING", "SUSPENDED", "COMPLETING")
        return self.usage.end is None

    @property
    def start(self) -> float | None:
        return self.usage.start or (self.accounting.start if self.accounting else None)

    @property
    def end(self) -> float | None:
        return self.usage.end or (self.accounting.end if self.accounting else None)

    @property
    def elapsed_s(self) -> float | None:
        if self.start is None:
            return None
        end = self.end if self.end is not None and not self.running else self.now
        return max(0.0, end - self.start)

    @property
    def cpus(self) -> int | None:
        known = [n.cpus for n in self.nodes if n.cpus is not None]
        if known:
            return sum(known)
        return self.accounting.cpus if self.accounting else None

    @property
    def cpu_efficiency(self) -> float | None:
        used = [n.cpu_s for n in self.nodes if n.cpu_s is not None]
        if not used or not self.cpus or not self.elapsed_s:
            return None
        return min(1.0, sum(used) / (self.cpus * self.elapsed_s))

    @property
    def memory_peak(self) -> float | None:
        known = [n.memory_peak for n in self.nodes if n.memory_peak is not None]
        return sum(known) if known else None

    @property
    def memory_request(self) -> float | None:
        if self.accounting and self.accounting.requested_memory:
            return self.accounting.requested_memory
        known = [n.memory_limit for n in self.nodes if n.memory_limit is not None]
        return sum(known) if known else None

    @property
    def gpu_memory_total(self) -> float | None:
        known = [g.memory_total for n in self.nodes for g in n.gpus if g.memory_total]
        return max(known) if known else None

    @property
    def energy_j(self) -> float | None:
        known = [g.energy_j for n in self.nodes for g in n.gpus if g.energy_j is not None]
        return sum(known) if known else None

    @property
    def energy_kwh(self) -> float | None:
        return self.energy_j / 3.6e6 if self.energy_j is not None else None

    @property
    def cpu_energy_j(self) -> float | None:
        known = [n.cpu_energy_j for n in self.nodes if n.cpu_energy_j is not None]
        return sum(known) if known else None

    @property
    def total_energy_kwh(self) -> float | None:
        """GPU energy plus the job's share of CPU and DRAM energy, where either is known."""
        known = [e for e in (self.energy_j, self.cpu_energy_j) if e is not None]
        return sum(known) / 3.6e6 if known else None

    @property
    def emissions_gco2e(self) -> float | None:
        """The whole energy (GPU, CPU and DRAM) times the configured factor (gCO2e/kWh);
        None without either."""
        kwh = self.total_energy_kwh
        return kwh * self.gco2e_per_kwh if kwh is not None and self.gco2e_per_kwh else None
