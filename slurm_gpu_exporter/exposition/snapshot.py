"""The immutable snapshot one sample produces and every scrape serves.

Plain frozen dataclasses: the sampler thread builds one, the collector turns it
into metric families, and nothing mutates it afterwards, so it can cross threads.
The snapshot holds its own copy of everything the exposition needs, so this module
(and metrics.py, server.py above it) imports nothing that reads files or runs commands.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client.metrics_core import Metric

from slurm_gpu_exporter.model.job import JobDescription


@dataclass(frozen=True)
class JobInfo(JobDescription):
    """What the exposition shows about a job: its labels, ``slurm_job_info`` and times."""

    end_time: float | None = None
    source: str = "spool"  # "spool" or "cgroup" (discovered without a record)

    @property
    def running(self) -> bool:
        return self.end_time is None


@dataclass(frozen=True)
class JobSample:
    """A job's CPU and memory figures at one sample (None: not measurable here)."""

    job: JobInfo
    gpus: int = 0
    cpus: int | None = None
    cpu_seconds: float | None = None
    memory_used_bytes: int | None = None
    memory_limit_bytes: int | None = None
    memory_peak_bytes: int | None = None
    oom_kills: int | None = None
    processes: int | None = None


@dataclass(frozen=True)
class JobGpuSample:
    """What one job does with one GPU (or MIG instance) it holds."""

    job: JobInfo
    gpu: str  # NVML index, or "<parent index>.<GPU instance id>" for MIG
    uuid: str
    allocated_seconds: float
    busy_seconds: float | None  # None where the GPU reports no utilization (MIG)
    utilization: float | None  # busy share over the last sample interval, 0..1
    memory_used_bytes: int
    memory_peak_bytes: int
    energy_joules: float | None
    processes: int
    # Seconds held with the driver's samples lost (in neither busy nor allocated);
    # None where the GPU reports no utilization (MIG).
    unknown_seconds: float | None = None
    # GPM activity seconds by name ("sm_active", ...); only where the job has the GPU
    # or MIG instance to itself and the GPU has GPM.
    activity_seconds: tuple[tuple[str, float], ...] = ()
    # What slowed or hit the GPU while the job held it (gpu/attribution/job_errors.py), by key:
    # "throttle:<reason>" seconds; "xid:<code>", "ecc:<type>", "remapped_rows:<cause>",
    # "pcie_replays", "nvlink:<kind>" counts. Present where the GPU has the counter.
    health: tuple[tuple[str, float], ...] = ()
    xid_last_seen: tuple[tuple[int, float], ...] = ()  # (Xid code, Unix time last seen)

    @property
    def jobid(self) -> str:
        return self.job.jobid

    @property
    def user(self) -> str:
        return self.job.user


@dataclass(frozen=True)
class GpuSample:
    """One physical GPU or MIG instance as the node sees it."""

    gpu: str
    uuid: str
    name: str
    minor: int | None
    pci_bus_id: str
    parent_uuid: str = ""  # set for MIG instances
    lost: bool = False
    utilization: float | None = None
    busy_seconds: float | None = None
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    power_watts: float | None = None
    energy_joules: float | None = None
    temperature_celsius: float | None = None
    ecc_corrected: int | None = None
    ecc_uncorrected: int | None = None
    xid_errors: tuple[tuple[int, int], ...] = ()  # (xid, count)
    unknown_seconds: float | None = None  # driver samples may have been lost (busy GPUs)
    driver_events: tuple[tuple[str, int], ...] = ()  # (kind, count): gpu/driver/integration.py
    unattributed_processes: int = 0
    unattributed_memory_bytes: int = 0
    # GPM totals by name (GPUs with GPM only): activity seconds, PCIe/NVLink bytes.
    activity_seconds: tuple[tuple[str, float], ...] = ()
    traffic_bytes: tuple[tuple[str, float], ...] = ()
    # The driver's throttled seconds by reason (only the reasons the GPU supports), SM
    # clocks, and its cumulative error counters by key ("remapped_rows:correctable",
    # "pcie_replays", "nvlink:crc_flit", ...) where it has them.
    throttled_seconds: tuple[tuple[str, float], ...] = ()
    sm_clock_hz: float | None = None
    sm_clock_max_hz: float | None = None
    error_counters: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True)
class UnattributedSample:
    """GPU use by processes outside every job, by user."""

    gpu: str
    uuid: str
    user: str
    processes: int
    memory_bytes: int
    busy_seconds: float | None = None  # counter; None where the GPU has no busy samples


@dataclass(frozen=True)
class JobCpuEnergySample:
    """A job's share of the node's CPU package or DRAM energy (RAPL), by its CPU time."""

    job: JobInfo
    domain: str  # "package" or "dram"
    joules: float


@dataclass(frozen=True)
class CpuEnergySample:
    """What one socket's RAPL counter measured since the agent started."""

    socket: str
    domain: str
    joules: float


@dataclass(frozen=True)
class JobNodeEnergySample:
    """A job's estimated share of the node's metered energy (node power integrated)."""

    job: JobInfo
    joules: float


@dataclass(frozen=True)
class SourceStatus:
    """Whether one data source (a name in node/source_health.SOURCES) worked in the last sample."""

    name: str
    ok: bool


@dataclass(frozen=True)
class StepTiming:
    """How long one step of the sample took (registry, cgroup, nvml, state)."""

    name: str
    duration_seconds: float


@dataclass(frozen=True)
class NodeIdentity:
    """Who the node is to Slurm: its NodeName (--node-name) and its ClusterName
    (slurm.conf; '' when unknown)."""

    node: str
    cluster: str = ""


@dataclass(frozen=True)
class Snapshot:
    timestamp: float
    jobs: tuple[JobSample, ...] = ()
    job_gpus: tuple[JobGpuSample, ...] = ()
    gpus: tuple[GpuSample, ...] = ()
    unattributed: tuple[UnattributedSample, ...] = ()
    nvml_up: bool | None = None  # None: GPU collection switched off
    sources: tuple[SourceStatus, ...] = ()
    steps: tuple[StepTiming, ...] = ()
    errors: dict[str, int] = field(default_factory=dict)
    sample_duration_seconds: float = 0.0
    # slurm_job_training_* families the relay held at the sample, labelled with jobid
    # and user by the relay; built afresh each sample and never changed afterwards.
    training: tuple[Metric, ...] = ()
    # CPU energy (RAPL): None when switched off (--powercap-root '').
    powercap_up: bool | None = None
    job_cpu_energy: tuple[JobCpuEnergySample, ...] = ()
    cpu_energy: tuple[CpuEnergySample, ...] = ()
    cpu_energy_outside_jobs: tuple[tuple[str, float], ...] = ()  # (domain, joules)
    # Node power (hwmon meter or a site command): None when no meter is configured.
    node_power_up: bool | None = None
    node_power_watts: float | None = None  # the last reading; None when it failed
    node_energy_joules: float | None = None  # None until the meter's first reading
    job_node_energy: tuple[JobNodeEnergySample, ...] = ()
    node_energy_outside_jobs: float | None = None
    # Who the node is to Slurm: the info series that joins a scrape target to its node.
    identity: NodeIdentity | None = None
