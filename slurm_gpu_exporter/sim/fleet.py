"""A fleet of simulated GPU nodes for load on Prometheus and the central tools.

Each node's snapshot is a pure function of (mix, node number, time): the same fleet
built twice serves the same series with the same values at the same time, so two
Prometheus topologies that scrape it see the same jobs. A snapshot is the agent's own
``Snapshot`` and is rendered by the agent's own ``Exposition`` (exposition/metrics.py):
families, labels and help cannot drift from what a node serves.

Jobs sit in slots: a node runs ``jobs_per_node`` slots, each a sequence of jobs one
after another (``churn_per_hour`` job starts per node and hour; 0: jobs never end).
A job's GPU use is constant over its life (one of ``PROFILES``), so a ratio (busy over
held) is the same whatever the scrape's phase; an ended job lingers with its last
values for ``linger_s`` seconds, as the agent's ``--job-linger`` does. Unknown time
(lost driver samples) is 0 wherever there is busy time, as on a healthy agent; one GPU
in ten has seen one driver event (a stamp jitter), one in fifty an Xid. Not simulated:
training-relay series (jobs push those) and ECC errors.
"""

from __future__ import annotations

import math
import uuid
import zlib
from dataclasses import dataclass, replace
from typing import Any

from slurm_gpu_exporter.exposition.snapshot import (
    CpuEnergySample,
    GpuSample,
    JobCpuEnergySample,
    JobGpuSample,
    JobInfo,
    JobSample,
    NodeIdentity,
    Snapshot,
    SourceStatus,
    StepTiming,
    UnattributedSample,
)
from slurm_gpu_exporter.node.source_health import SOURCES

EPOCH = 1_780_000_000.0  # the default fleet start
USERS = ("alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi")
ACCOUNTS = ("physics", "chem", "ml", "bio")
GPU_MEMORY = 80 << 30
MIG_MEMORY = 10 << 30
GPM_KINDS = ("sm_active", "sm_occupancy", "tensor_active", "dram_active")


@dataclass(frozen=True)
class Profile:
    """How a job uses what it holds: busy share of its GPUs, its GPU memory, CPU cores."""

    name: str
    busy: float
    gpu_memory_gib: float
    cores: float


# A quarter of the jobs hold GPUs they never use: the low-util report's subject.
PROFILES = (
    Profile("train", 0.9, 60.0, 6.0),
    Profile("sweep", 0.35, 20.0, 2.0),
    Profile("notebook", 0.02, 4.0, 0.5),
    Profile("idle", 0.0, 1.0, 0.1),
)


@dataclass(frozen=True)
class FleetMix:
    """What the simulated fleet looks like."""

    nodes: int
    gpus_per_node: int = 8
    jobs_per_node: int = 8
    churn_per_hour: float = 0.0  # job starts per node per hour; 0: jobs never end
    mig_share: float = 0.0  # share of the nodes whose GPUs are split into MIG instances
    mig_instances: int = 7  # instances per GPU on a MIG node
    linger_s: float = 60.0
    stop_at: float | None = None  # every job ends then, and nothing starts after it
    name_pad: int = 0  # characters added to every job name (cardinality tests)
    seed: int = 0
    epoch: float = EPOCH  # slots' phases count from here (a fleet's start)

    @property
    def job_seconds(self) -> float:
        """How long one job in a slot runs (one day when nothing churns)."""
        if self.churn_per_hour <= 0:
            return math.inf
        return self.jobs_per_node * 3600.0 / self.churn_per_hour


@dataclass(frozen=True)
class SlotJob:
    """One job in one slot: what it is and when it runs."""

    info: JobInfo
    profile: Profile
    devices: tuple[tuple[str, str], ...]  # (gpu, uuid) it holds
    start: float
    end: float | None  # None: still running at the snapshot's time

    def elapsed(self, now: float) -> float:
        return max(0.0, (now if self.end is None else self.end) - self.start)


def _hash(*parts: object) -> int:
    return zlib.crc32("/".join(map(str, parts)).encode())


def node_name(mix: FleetMix, node: int) -> str:
    return f"gpu{node:05d}"


def is_mig_node(mix: FleetMix, node: int) -> bool:
    return (_hash(mix.seed, "mig", node) % 1000) < mix.mig_share * 1000


def devices(mix: FleetMix, node: int) -> tuple[GpuSample, ...]:
    """The node's GPUs (and MIG instances, each after its parent), without figures."""
    out = []
    for i in range(mix.gpus_per_node):
        parent = f"GPU-{uuid.UUID(int=_hash(mix.seed, node, i) << 96 | node << 16 | i)}"
        bus = f"00000000:{0x1b + 0x20 * i:02X}:00.0"
        if is_mig_node(mix, node):
            for gi in range(1, mix.mig_instances + 1):
                mig = f"MIG-{uuid.UUID(int=_hash(mix.seed, node, i, gi) << 96 | gi)}"
                out.append(GpuSample(gpu=f"{i}.{gi}", uuid=mig, name="NVIDIA A100 MIG 1g.10gb",
                                     minor=None, pci_bus_id=bus, parent_uuid=parent,
                                     memory_total_bytes=MIG_MEMORY))
        else:
            out.append(GpuSample(gpu=str(i), uuid=parent, name="NVIDIA H100 80GB HBM3", minor=i,
                                 pci_bus_id=bus, memory_total_bytes=GPU_MEMORY))
    return tuple(out)


def _slot_devices(all_devices: tuple[GpuSample, ...], jobs: int,
                  slot: int) -> tuple[tuple[str, str], ...]:
    """The devices slot ``slot`` holds: an equal share, or one shared device when the
    node runs more jobs than it has devices (sharding, MPS)."""
    n = len(all_devices)
    if jobs <= n:
        share = n // jobs
        chosen = all_devices[slot * share:(slot + 1) * share]
    else:
        chosen = (all_devices[slot % n],)
    return tuple((d.gpu, d.uuid) for d in chosen)


def slot_jobs(mix: FleetMix, node: int, now: float) -> list[SlotJob]:
    """The jobs on ``node`` at ``now``: each slot's running job and any lingering one."""
    all_devices = devices(mix, node)
    length = mix.job_seconds
    out = []
    for slot in range(mix.jobs_per_node):
        phase = (_hash(mix.seed, "phase", node, slot) % 3600) * (
            1.0 if math.isinf(length) else length / 3600.0)
        first = mix.epoch - phase
        if math.isinf(length):
            gens = [0]
        else:
            current = math.floor((min(now, mix.stop_at or now) - first) / length)
            gens = [current - 1, current]
        for gen in gens:
            start = first if math.isinf(length) else first + gen * length
            end: float | None = start + length
            if mix.stop_at is not None and (end is None or end > mix.stop_at):
                end = mix.stop_at
            if start > now or (mix.stop_at is not None and start >= mix.stop_at):
                continue
            if end is not None and end > now:
                end = None
            if end is not None and now - end > mix.linger_s:
                continue
            out.append(_job(mix, node, slot, gen, start, end, all_devices))
    return out


def _job(mix: FleetMix, node: int, slot: int, gen: int, start: float, end: float | None,
         all_devices: tuple[GpuSample, ...]) -> SlotJob:
    key = _hash(mix.seed, "job", node, slot, gen)
    # Job ids: unique over the fleet and over a slot's generations.
    jobid = str(1_000_000 + (node * mix.jobs_per_node + slot) * 10_000 + gen % 10_000)
    user = USERS[key % len(USERS)]
    profile = PROFILES[(key >> 8) % len(PROFILES)]
    name = f"{profile.name}-{key % 97}" + "x" * mix.name_pad
    info = JobInfo(jobid=jobid, user=user, uid=2000 + USERS.index(user),
                   account=ACCOUNTS[(key >> 4) % len(ACCOUNTS)], partition="gpu",
                   qos="normal", name=name, start_time=start, end_time=end)
    return SlotJob(info, profile, _slot_devices(all_devices, mix.jobs_per_node, slot), start, end)


def snapshot(mix: FleetMix, node: int, now: float) -> Snapshot:
    """What node ``node``'s agent would serve at ``now``."""
    jobs = slot_jobs(mix, node, now)
    mig = is_mig_node(mix, node)
    job_samples, job_gpus = [], []
    device_busy: dict[str, float] = {}
    device_memory: dict[str, int] = {}
    for job in jobs:
        t = job.elapsed(now)
        running = job.end is None
        memory = int(job.profile.gpu_memory_gib * 2**30 / max(1, len(job.devices)))
        if mig:
            memory = min(memory, MIG_MEMORY)
        job_samples.append(JobSample(
            job=job.info, gpus=len(job.devices), cpus=8,
            cpu_seconds=round(job.profile.cores * t, 3),
            memory_used_bytes=int(job.profile.cores * 4 * 2**30) if running else 0,
            memory_limit_bytes=64 << 30, memory_peak_bytes=int(job.profile.cores * 5 * 2**30),
            oom_kills=0, processes=len(job.devices) + 2 if running else 0))
        for gpu, dev_uuid in job.devices:
            busy = None if mig else round(job.profile.busy * t, 3)
            activity = () if mig else tuple(
                (kind, round(job.profile.busy * t * share, 3))
                for kind, share in zip(GPM_KINDS, (0.8, 0.5, 0.3, 0.4), strict=True))
            job_gpus.append(JobGpuSample(
                job=JobInfo(jobid=job.info.jobid, user=job.info.user), gpu=gpu, uuid=dev_uuid,
                allocated_seconds=round(t, 3), busy_seconds=busy,
                unknown_seconds=None if busy is None else 0.0,
                utilization=(job.profile.busy if running else 0.0) if not mig else None,
                memory_used_bytes=memory if running else 0, memory_peak_bytes=memory,
                energy_joules=None if mig else round((70 + 500 * job.profile.busy) * t, 3),
                processes=1 if running else 0, activity_seconds=activity,
                **_job_health(mix, node, dev_uuid, job.profile.busy, t, job.start)))
            if running:
                device_busy[dev_uuid] = device_busy.get(dev_uuid, 0.0) + job.profile.busy
                device_memory[dev_uuid] = device_memory.get(dev_uuid, 0) + memory
    return Snapshot(
        timestamp=now, jobs=tuple(job_samples), job_gpus=tuple(job_gpus),
        gpus=tuple(_device_figures(d, device_busy, device_memory, now - mix.epoch,
                                   _xids(mix, node, d))
                   for d in devices(mix, node)),
        unattributed=_stray(mix, node, now), nvml_up=True,
        identity=NodeIdentity(node_name(mix, node)),
        sources=tuple(SourceStatus(s, True) for s in SOURCES),
        steps=(StepTiming("registry", 0.001), StepTiming("cgroup", 0.003),
               StepTiming("nvml", 0.01), StepTiming("state", 0.0005)),
        errors=dict.fromkeys(SOURCES, 0), sample_duration_seconds=0.0145,
        **_cpu_energy(job_samples, now - mix.epoch))


CORE_JOULES = 8.0  # CPU package joules per busy core-second; DRAM a tenth of it
IDLE_W = 50.0  # per socket, outside every job


def _cpu_energy(jobs: list[JobSample], since_epoch: float) -> dict[str, Any]:
    """RAPL families as the agent serves them: each job's share by its CPU time, the two
    sockets' totals and the rest outside jobs, adding up."""
    shares = {j.job.jobid: (j.job, (j.cpu_seconds or 0.0) * CORE_JOULES) for j in jobs}
    package = sum(p for _, p in shares.values())
    idle = IDLE_W * max(0.0, since_epoch)
    return {
        "powercap_up": True,
        "job_cpu_energy": tuple(JobCpuEnergySample(info, domain, round(p * k, 3))
                                for info, p in shares.values()
                                for domain, k in (("package", 1.0), ("dram", 0.1))),
        "cpu_energy": tuple(CpuEnergySample(str(s), domain, round((package / 2 + idle) * k, 3))
                            for s in (0, 1) for domain, k in (("package", 1.0), ("dram", 0.1))),
        "cpu_energy_outside_jobs": (("dram", round(2 * idle * 0.1, 3)),
                                    ("package", round(2 * idle, 3))),
    }


def _device_figures(d: GpuSample, busy: dict[str, float], memory: dict[str, int],
                    since_epoch: float, xid_errors: tuple[tuple[int, int], ...]) -> GpuSample:
    """A device with figures. Its gauges follow the jobs on it now; its counters grow at
    fixed rates (half busy, 300 W), so they never go down when jobs come and go. (The
    clamped-samples counter is left out, as on a GPU whose driver never reported one.)"""
    util = min(1.0, busy.get(d.uuid, 0.0))
    used = min(memory.get(d.uuid, 0), d.memory_total_bytes or 0)
    if d.parent_uuid:  # MIG: memory only, as NVML gives it
        return replace(d, memory_used_bytes=used)
    age = since_epoch + 86_400.0  # the driver loaded a day before the fleet
    return replace(d, utilization=util, busy_seconds=round(0.5 * age, 3),
                   memory_used_bytes=used, power_watts=70 + 500 * util,
                   energy_joules=round(300 * age, 3), temperature_celsius=40 + 30 * util,
                   ecc_corrected=0, ecc_uncorrected=0, xid_errors=xid_errors,
                   unknown_seconds=0.0, driver_events=_driver_events(d),
                   activity_seconds=(("fp64_active", round(0.05 * age, 3)),
                                     ("sm_active", round(0.4 * age, 3))),
                   traffic_bytes=(("nvlink_receive", round(5e8 * age, 3)),
                                  ("pcie_transmit", round(1e9 * age, 3))),
                   throttled_seconds=(("power", round(0.02 * age, 3)), ("thermal", 0.0)),
                   sm_clock_hz=1.98e9 - 3.9e8 * util, sm_clock_max_hz=1.98e9,
                   error_counters=(("nvlink:crc_flit", 0), ("pcie_replays", 0),
                                   ("remapped_rows:correctable", 0),
                                   ("remapped_rows:uncorrectable", 0)))


def _job_health(mix: FleetMix, node: int, uuid: str, busy: float, held: float,
                start: float) -> dict[str, Any]:
    """Power-capped 5 % of the busy time, no errors; the Xid 13 of a GPU that has one
    (``_xids``) hit the job a minute in."""
    health = [("ecc:corrected", 0.0), ("nvlink:crc_flit", 0.0), ("pcie_replays", 0.0),
              ("remapped_rows:correctable", 0.0), ("throttle:power", round(0.05 * busy * held, 3)),
              ("throttle:thermal", 0.0)]
    hit = _hash(mix.seed, "xid", node, uuid) % 50 == 0 and held > 60
    return {"health": tuple(health + [("xid:13", 1.0)] * hit),
            "xid_last_seen": ((13, start + 60.0),) if hit else ()}


def _driver_events(d: GpuSample) -> tuple[tuple[str, int], ...]:
    """One GPU in ten has had one sample stamped a little off by its driver."""
    return (("stamp_jitter", 1),) if _hash("events", d.uuid) % 10 == 0 else ()


def _xids(mix: FleetMix, node: int, d: GpuSample) -> tuple[tuple[int, int], ...]:
    """One GPU in fifty has seen an Xid 13 (a graphics engine exception) once."""
    return ((13, 1),) if _hash(mix.seed, "xid", node, d.uuid) % 50 == 0 else ()


def _stray(mix: FleetMix, node: int, now: float) -> tuple[UnattributedSample, ...]:
    """One node in ten has a process outside every job on its first GPU (an ssh'd user)."""
    if _hash(mix.seed, "stray", node) % 10 or is_mig_node(mix, node):
        return ()
    d = devices(mix, node)[0]
    return (UnattributedSample(gpu=d.gpu, uuid=d.uuid, user=USERS[node % len(USERS)],
                               processes=1, memory_bytes=1 << 30,
                               busy_seconds=round(0.1 * max(0.0, now - mix.epoch), 3)),)
