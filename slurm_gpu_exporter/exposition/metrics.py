"""Every metric family the agent exposes, built from one Snapshot.

This module and gpu_metrics.py (GPM activity, throttling and errors) name every metric
family of the agent but one kind: the training relay's ``slurm_job_training_*``
families, which ``training_relay/store.py`` builds from what jobs send and the snapshot
carries as they are (among them ``JOB_MLFLOW_RUN_INFO``, named here, which the relay
checks and renames). ``exposition/rendered.py`` turns the families into the bodies a
scrape is served.
"""

from __future__ import annotations

import platform
from collections.abc import Iterable, Iterator

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from slurm_gpu_exporter import __version__
from slurm_gpu_exporter.exposition.families import (
    GPU_LABELS,
    INFO_LABELS,
    JOB_GPU_LABELS,
    JOB_LABELS,
    _counter,
    _gauge,
    _maybe,
)
from slurm_gpu_exporter.exposition.gpu_metrics import gpm_families, health_families
from slurm_gpu_exporter.exposition.snapshot import Snapshot

# The MLflow runs a job's script had active, as the training relay shows what the
# client pushes as slurm_job_training_mlflow_run_info (training_relay/payload.py).
JOB_MLFLOW_RUN_INFO = "slurm_job_mlflow_run_info"
def job_families(snapshot: Snapshot) -> Iterator[Metric]:
    """slurm_job_* families: one series per job that is running or lingering."""
    info = _gauge("slurm_job_info", "Slurm job metadata; value is always 1.", INFO_LABELS)
    start = _gauge("slurm_job_start_time_seconds", "When the job started (Unix time).",
                   JOB_LABELS)
    end = _gauge("slurm_job_end_time_seconds",
                 "When the job ended (Unix time); present while an ended job lingers.",
                 JOB_LABELS)
    cpus = _gauge("slurm_job_cpus", "CPUs allocated to the job on this node (its cpuset).",
                  JOB_LABELS)
    cpu_seconds = _counter("slurm_job_cpu_seconds", "CPU time used by the job on this node.",
                           JOB_LABELS)
    mem_used = _gauge("slurm_job_memory_used_bytes",
                      "Memory the job uses on this node: cgroup usage minus inactive page "
                      "cache (working set).", JOB_LABELS)
    mem_limit = _gauge("slurm_job_memory_limit_bytes",
                       "The job's memory limit on this node; absent when unlimited.",
                       JOB_LABELS)
    mem_peak = _gauge("slurm_job_memory_peak_bytes",
                      "Highest memory usage of the job on this node (kernel high-water mark, "
                      "page cache included).", JOB_LABELS)
    ooms = _counter("slurm_job_oom_kills", "Processes of the job killed by the OOM killer.",
                    JOB_LABELS)
    procs = _gauge("slurm_job_processes", "Processes of the job on this node.", JOB_LABELS)
    gpus = _gauge("slurm_job_gpus", "GPUs allocated to the job on this node.", JOB_LABELS)

    for sample in snapshot.jobs:
        job = sample.job
        key = [job.jobid, job.user]
        info.add_metric(
            [job.jobid, job.user, "" if job.uid is None else str(job.uid), job.account,
             job.partition, job.qos, job.name, job.array_job_id, job.array_task_id, job.source],
            1,
        )
        gpus.add_metric(key, sample.gpus)
        _maybe(start, key, job.start_time)
        _maybe(end, key, job.end_time)
        _maybe(cpus, key, sample.cpus)
        _maybe(cpu_seconds, key, sample.cpu_seconds)
        _maybe(mem_used, key, sample.memory_used_bytes)
        _maybe(mem_limit, key, sample.memory_limit_bytes)
        _maybe(mem_peak, key, sample.memory_peak_bytes)
        _maybe(ooms, key, sample.oom_kills)
        _maybe(procs, key, sample.processes)
    yield from (info, start, end, cpus, cpu_seconds, mem_used, mem_limit, mem_peak, ooms,
                procs, gpus)


def job_gpu_families(snapshot: Snapshot) -> Iterator[Metric]:
    """slurm_job_gpu_* families: one series per job and GPU it holds."""
    allocated = _counter("slurm_job_gpu_allocated_seconds",
                         "Seconds the GPU has been allocated to the job.", JOB_GPU_LABELS)
    busy = _counter("slurm_job_gpu_busy_seconds",
                    "Seconds the GPU was busy for the job, integrated from the driver's "
                    "utilization samples.", JOB_GPU_LABELS)
    util = _gauge("slurm_job_gpu_utilization_ratio",
                  "The job's share of GPU busy time over the last sample interval (0..1).",
                  JOB_GPU_LABELS)
    mem = _gauge("slurm_job_gpu_memory_used_bytes", "GPU memory used by the job's processes.",
                 JOB_GPU_LABELS)
    peak = _gauge("slurm_job_gpu_memory_peak_bytes",
                  "Highest GPU memory used by the job's processes, as sampled.", JOB_GPU_LABELS)
    energy = _counter("slurm_job_gpu_energy_joules",
                      "GPU energy attributed to the job (split by busy share when shared).",
                      JOB_GPU_LABELS)
    procs = _gauge("slurm_job_gpu_processes", "Processes of the job on the GPU.",
                   JOB_GPU_LABELS)
    for s in snapshot.job_gpus:
        key = [s.jobid, s.user, s.gpu, s.uuid]
        allocated.add_metric(key, s.allocated_seconds)
        _maybe(busy, key, s.busy_seconds)
        _maybe(util, key, s.utilization)
        mem.add_metric(key, s.memory_used_bytes)
        peak.add_metric(key, s.memory_peak_bytes)
        _maybe(energy, key, s.energy_joules)
        procs.add_metric(key, s.processes)
    yield from (allocated, busy, util, mem, peak, energy, procs)


# NVML GPM activities (Hopper and later; snapshot keys) and what each fraction measures.
def gpu_families(snapshot: Snapshot) -> Iterator[Metric]:
    """slurm_gpu_* device families."""
    info = _gauge("slurm_gpu_info", "GPU device metadata; value is always 1.",
                  [*GPU_LABELS, "name", "minor", "pci_bus_id", "parent_uuid"])
    lost = _gauge("slurm_gpu_lost", "1 when the GPU stopped answering (fell off the bus).",
                  GPU_LABELS)
    util = _gauge("slurm_gpu_utilization_ratio",
                  "GPU busy share over the last sample interval (0..1).", GPU_LABELS)
    busy = _counter("slurm_gpu_busy_seconds", "Seconds the GPU was busy.", GPU_LABELS)
    mem_used = _gauge("slurm_gpu_memory_used_bytes", "GPU memory in use.", GPU_LABELS)
    mem_total = _gauge("slurm_gpu_memory_total_bytes", "GPU memory in total.", GPU_LABELS)
    power = _gauge("slurm_gpu_power_watts", "GPU power draw.", GPU_LABELS)
    energy = _counter("slurm_gpu_energy_joules", "GPU energy since the driver loaded.",
                      GPU_LABELS)
    temp = _gauge("slurm_gpu_temperature_celsius", "GPU temperature.", GPU_LABELS)
    ecc = _counter("slurm_gpu_ecc_errors", "ECC errors since the driver loaded (volatile).",
                   [*GPU_LABELS, "type"])
    xid = _counter("slurm_gpu_xid_errors", "Xid errors seen by the agent, by Xid code.",
                   [*GPU_LABELS, "xid"])
    unattr_procs = _gauge("slurm_gpu_unattributed_processes",
                          "GPU processes that belong to no Slurm job, by user.",
                          [*GPU_LABELS, "user"])
    unattr_mem = _gauge("slurm_gpu_unattributed_memory_bytes",
                        "GPU memory of processes that belong to no Slurm job, by user.",
                        [*GPU_LABELS, "user"])
    unattr_busy = _counter("slurm_gpu_unattributed_busy_seconds",
                           "Seconds of GPU busy time of processes that belong to no Slurm job, "
                           "by user.", [*GPU_LABELS, "user"])
    for g in snapshot.gpus:
        key = [g.gpu, g.uuid]
        info.add_metric([*key, g.name, "" if g.minor is None else str(g.minor), g.pci_bus_id,
                         g.parent_uuid], 1)
        lost.add_metric(key, 1 if g.lost else 0)
        _maybe(util, key, g.utilization)
        _maybe(busy, key, g.busy_seconds)
        _maybe(mem_used, key, g.memory_used_bytes)
        _maybe(mem_total, key, g.memory_total_bytes)
        _maybe(power, key, g.power_watts)
        _maybe(energy, key, g.energy_joules)
        _maybe(temp, key, g.temperature_celsius)
        _maybe(ecc, [*key, "corrected"], g.ecc_corrected)
        _maybe(ecc, [*key, "uncorrected"], g.ecc_uncorrected)
        for code, count in g.xid_errors:
            xid.add_metric([*key, str(code)], count)
    for u in snapshot.unattributed:
        unattr_procs.add_metric([u.gpu, u.uuid, u.user], u.processes)
        unattr_mem.add_metric([u.gpu, u.uuid, u.user], u.memory_bytes)
        _maybe(unattr_busy, [u.gpu, u.uuid, u.user], u.busy_seconds)
    yield from (info, lost, util, busy, mem_used, mem_total, power, energy, temp, ecc, xid,
                unattr_procs, unattr_mem, unattr_busy)


def cpu_energy_families(snapshot: Snapshot) -> Iterator[Metric]:
    """CPU package and DRAM energy (RAPL): measured per socket, shared among the jobs by
    their CPU time, the rest outside jobs; absent where RAPL is switched off."""
    job = _counter("slurm_job_cpu_energy_joules", "The job's share of the node's CPU "
                   "package or DRAM energy (RAPL), by its CPU time out of the node's busy CPU "
                   "time: an estimate.", [*JOB_LABELS, "domain"])
    node = _counter("slurm_cpu_energy_joules", "CPU package or DRAM energy the socket's RAPL "
                    "counter measured since the agent started.", ["socket", "domain"])
    outside = _counter("slurm_cpu_outside_jobs_energy_joules", "CPU package or DRAM energy "
                       "of no job (idle power, processes outside jobs): the measured total "
                       "less the jobs' shares.", ["domain"])
    for s in snapshot.job_cpu_energy:
        job.add_metric([s.job.jobid, s.job.user, s.domain], s.joules)
    for c in snapshot.cpu_energy:
        node.add_metric([c.socket, c.domain], c.joules)
    for domain, joules in snapshot.cpu_energy_outside_jobs:
        outside.add_metric([domain], joules)
    yield from (job, node, outside)


def node_energy_families(snapshot: Snapshot) -> Iterator[Metric]:
    """The node's metered power and energy, each job's estimated share of it, the rest
    outside jobs; absent where no node power meter is configured."""
    job = _counter("slurm_job_node_energy_joules", "The job's share of the node's metered "
                   "energy, by its GPU energy plus its CPU share out of all the GPUs' and "
                   "RAPL's energy: an estimate, not a measurement.", JOB_LABELS)
    node = _counter("slurm_node_energy_joules", "The node's energy: its power meter's "
                    "readings integrated since the agent started (intervals with a failed "
                    "reading left out).", [])
    outside = _counter("slurm_node_outside_jobs_energy_joules", "Node energy of no job "
                       "(fans, disks, power supplies, idle parts, processes outside jobs): "
                       "the measured total less the jobs' shares.", [])
    power = _gauge("slurm_node_power_watts", "The node's power meter's last reading.", [])
    for s in snapshot.job_node_energy:
        job.add_metric([s.job.jobid, s.job.user], s.joules)
    _maybe(node, [], snapshot.node_energy_joules)
    _maybe(outside, [], snapshot.node_energy_outside_jobs)
    _maybe(power, [], snapshot.node_power_watts)
    yield from (job, node, outside, power)


def sample_gap_families(snapshot: Snapshot) -> Iterator[Metric]:
    """Time the driver's samples did not cover, and what its samples did."""
    lost = "the driver's samples may have been lost (agent stalled, machine suspended)"
    job = _counter("slurm_job_gpu_unknown_seconds", f"Seconds the job held the GPU where {lost}"
                   "; in neither busy nor allocated time.", JOB_GPU_LABELS)
    device = _counter("slurm_gpu_unknown_seconds", f"Seconds where {lost}; not idle time.",
                      GPU_LABELS)
    events = _counter("slurm_gpu_driver_events", "What the driver's sample buffers did, by "
                      "kind (docs/metrics.md).", [*GPU_LABELS, "kind"])
    for s in snapshot.job_gpus:
        _maybe(job, [s.jobid, s.user, s.gpu, s.uuid], s.unknown_seconds)
    for g in snapshot.gpus:
        _maybe(device, [g.gpu, g.uuid], g.unknown_seconds)
        [events.add_metric([g.gpu, g.uuid, kind], n) for kind, n in g.driver_events]
    yield from (job, device, events)


def self_families(snapshot: Snapshot) -> Iterator[Metric]:
    """slurm_gpu_exporter_* families about the agent itself."""
    build = _gauge("slurm_gpu_exporter_build_info", "Agent version; value is always 1.",
                   ["version", "python_version"])
    build.add_metric([__version__, platform.python_version()], 1)
    yield build
    if snapshot.identity is not None:
        # The one series with fixed labels: it maps a scrape target (instance) to its
        # Slurm node, so the central tools join on it whatever the target is named.
        # Named slurm_* so a scrape config's own node/cluster labels never clash.
        node = _gauge("slurm_gpu_exporter_node_info",
                      "The Slurm node this agent runs on (--node-name) and its cluster "
                      "(slurm.conf ClusterName, empty when unknown); value is always 1.",
                      ["slurm_node", "slurm_cluster"])
        node.add_metric([snapshot.identity.node, snapshot.identity.cluster], 1)
        yield node
    if snapshot.nvml_up is not None:
        nvml = _gauge("slurm_gpu_exporter_nvml_up",
                      "1 when NVML answered in the last sample, 0 when it is missing or "
                      "failing.", [])
        nvml.add_metric([], 1 if snapshot.nvml_up else 0)
        yield nvml
    duration = _gauge("slurm_gpu_exporter_sample_duration_seconds",
                      "Wall time of the last sample, by step (registry, cgroup, nvml, state) "
                      "and in total.", ["source"])
    for step in snapshot.steps:
        duration.add_metric([step.name], step.duration_seconds)
    duration.add_metric(["total"], snapshot.sample_duration_seconds)
    # source_up and sample_errors_total share one set of `source` values
    # (node/source_health.SOURCES).
    up = _gauge("slurm_gpu_exporter_source_up",
                "1 when the source met no error in the last sample, by source.", ["source"])
    for status in snapshot.sources:
        up.add_metric([status.name], 1 if status.ok else 0)
    errors = _counter("slurm_gpu_exporter_sample_errors",
                      "Problems met while sampling, by source (bad spool files, unreadable "
                      "cgroups, failed Slurm look-ups, NVML errors, state dir writes, refused "
                      "training pushes, unreadable RAPL counters, failed node power readings).",
                      ["source"])
    for source, count in sorted(snapshot.errors.items()):
        errors.add_metric([source], count)
    last = _gauge("slurm_gpu_exporter_last_sample_timestamp_seconds",
                  "When the snapshot being served was taken (Unix time); a stale value means "
                  "sampling is stuck.", [])
    last.add_metric([], snapshot.timestamp)
    jobs = _gauge("slurm_gpu_exporter_jobs", "Jobs tracked by the agent, by state.", ["state"])
    running = sum(1 for s in snapshot.jobs if s.job.running)
    jobs.add_metric(["running"], running)
    jobs.add_metric(["ended"], len(snapshot.jobs) - running)
    yield from (duration, up, errors, last, jobs)


class SnapshotCollector(Collector):
    """Yields fresh families from one snapshot (the client library's collector protocol)."""

    def __init__(self, snapshot: Snapshot, extra: Iterable[Collector] = ()) -> None:
        self.snapshot = snapshot
        self.extra = tuple(extra)

    def collect(self) -> Iterator[Metric]:
        yield from job_families(self.snapshot)
        yield from job_gpu_families(self.snapshot)
        if self.snapshot.nvml_up is not None:
            yield from gpu_families(self.snapshot)
            yield from sample_gap_families(self.snapshot)
        yield from gpm_families(self.snapshot)
        yield from health_families(self.snapshot)
        if self.snapshot.powercap_up is not None:
            yield from cpu_energy_families(self.snapshot)
        if self.snapshot.node_power_up is not None:
            yield from node_energy_families(self.snapshot)
        yield from self_families(self.snapshot)
        yield from self.snapshot.training  # relayed from inside jobs (training_relay)
        for collector in self.extra:
            yield from collector.collect()
