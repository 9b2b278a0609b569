"""The sources of a sample, in their honest order: one table row each.

Each row builds one source (jobs/source.py's protocol) from the agent's flags and what
every source shares (``Node``), or says it is switched off (None). The sampler runs them
in this order, each seeing the parts of those above it: the tracker's jobs first, their
cgroup figures, RAPL (shared by CPU time), the GPUs, the node's meter (shared by what
the GPUs and RAPL measured), the training relay (synced with the tracker's answer).
Adding a source is its module and a row here (and its flags, its health name in
node/source_health.SOURCES, its snapshot fields and metric families).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slurm_gpu_exporter.gpu.backend import GpuBackend
from slurm_gpu_exporter.gpu.source import GpuSampler
from slurm_gpu_exporter.hooks import spool
from slurm_gpu_exporter.jobs.cpu_energy import CpuEnergySource
from slurm_gpu_exporter.jobs.node_energy import NodeEnergySource
from slurm_gpu_exporter.jobs.source import SampleSource
from slurm_gpu_exporter.jobs.stats import JobStatsCollector
from slurm_gpu_exporter.jobs.tracker import JobTracker
from slurm_gpu_exporter.node.cgroup import CgroupFS
from slurm_gpu_exporter.node.hwmon import DEFAULT_METERS, HwmonPowerMeter
from slurm_gpu_exporter.node.power_command import PowerCommand
from slurm_gpu_exporter.node.powercap import PowercapReader
from slurm_gpu_exporter.node.slurm.lookup import SlurmMetadata, make_lookup
from slurm_gpu_exporter.node.source_health import SourceErrors
from slurm_gpu_exporter.training_relay import RelayLimits, TrainingRelay
from slurm_gpu_exporter.training_relay.source import RelayJobs, TrainingSource

log = logging.getLogger("slurm_gpu_exporter")


@dataclass
class Node:
    """What the sources of one agent share: its flags, the cgroup reader, the error
    counters, the uids whose files it trusts, the simulated node (--simulate) and the
    exit stack that stops what a source started."""

    args: argparse.Namespace
    cgroups: CgroupFS
    errors: SourceErrors
    trusted_uids: frozenset[int]
    stack: contextlib.ExitStack
    simulation: Any = None  # sim.simulate.SimulatedNode


def _tracker(node: Node) -> JobTracker:
    args = node.args
    if node.simulation is not None:
        lookup = node.simulation.slurm_lookup
    elif args.slurm_lookup == "off":
        lookup = None
    else:
        lookup = make_lookup(args.node_name, prefer_pyslurm=args.slurm_lookup == "auto")
    return JobTracker(
        args.spool_dir, node.cgroups, SlurmMetadata(lookup, errors=node.errors), node.errors,
        proc_root=args.proc_root, job_linger=args.job_linger,
        cgroup_grace=args.cgroup_grace, trusted_uids=node.trusted_uids,
    )


def _job_stats(node: Node) -> JobStatsCollector:
    return JobStatsCollector(node.cgroups, node.args.proc_root, node.errors)


def _cpu_energy(node: Node) -> CpuEnergySource | None:
    if not node.args.powercap_root:
        return None
    return CpuEnergySource(PowercapReader(Path(node.args.powercap_root)), node.args.proc_root,
                           node.errors)


def _gpus(node: Node) -> GpuSampler:
    backend: GpuBackend
    if node.simulation is not None:
        from slurm_gpu_exporter.gpu.simulated import SimulatedBackend

        backend = SimulatedBackend(node.simulation.gpu_count, node.simulation.gpu_processes)
    else:
        from slurm_gpu_exporter.gpu.nvml.backend import NvmlBackend

        backend = NvmlBackend()
    return GpuSampler(backend, node.args.proc_root, node.errors, cgroups=node.cgroups,
                      poll_timeout=max(1.0, 0.8 * node.args.sample_interval))


def _node_energy(node: Node) -> NodeEnergySource | None:
    """The node power meter the flags ask for: the site command, else hwmon, else none."""
    args = node.args
    meter: PowerCommand | HwmonPowerMeter
    if args.node_power_command:
        meter = PowerCommand(args.node_power_command, args.node_power_interval,
                             args.node_power_timeout)
        meter.start()
        node.stack.callback(meter.stop)
    elif args.hwmon_root:
        meter = HwmonPowerMeter(Path(args.hwmon_root),
                                tuple(args.node_power_hwmon_names or DEFAULT_METERS))
    else:
        return None
    return NodeEnergySource(meter, node.errors)


def _training(node: Node) -> TrainingSource | None:
    """Serve training.sock, or say in one line why not (the agent then runs without it)."""
    args = node.args
    if not args.training_relay:
        return None
    jobs = RelayJobs(args.proc_root, node.cgroups)
    # A job is known to the relay from the first sample after it starts: its first
    # connections wait that long, with room for a slow sample.
    limits = RelayLimits(pending_seconds=max(30.0, 3 * args.sample_interval))
    relay = TrainingRelay(args.spool_dir, jobs.job_of_pid, job_of_key=jobs.job_of_key,
                          limits=limits)
    try:
        os.close(spool.open_spool_dir(args.spool_dir, create=True))
        relay.start()
    except ValueError as exc:
        log.error("training relay not started: %s; use a shorter --spool-dir or "
                  "--no-training.relay", exc)
        return None
    except OSError as exc:
        log.error("training relay not started: cannot serve %s: %s; running without it "
                  "(check --spool-dir, or pass --no-training.relay)", relay.path,
                  exc.strerror or exc)
        return None
    log.info("training relay listening on %s", relay.path)
    source = TrainingSource(relay, jobs, node.errors)
    node.stack.callback(source.stop)
    return source


# The sources, in the order they run.
SOURCE_TABLE: tuple[Callable[[Node], SampleSource | None], ...] = (
    _tracker,
    _job_stats,
    _cpu_energy,
    _gpus,
    _node_energy,
    _training,
)


def build_sources(node: Node) -> list[SampleSource]:
    """The sources the flags switch on, in the table's order."""
    return [source for row in SOURCE_TABLE if (source := row(node)) is not None]
