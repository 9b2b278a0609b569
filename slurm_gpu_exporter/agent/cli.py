"""``slurm-gpu-exporter``: the per-node agent.

Flags follow Prometheus exporter conventions (``--web.listen-address``,
``--web.config.file``, ``--log.level``). ``--simulate`` runs the real agent over a
synthetic node (cgroups, /proc, spool and GPUs in a temporary directory), so
it shows real-looking metrics anywhere.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import sys
import tempfile
from pathlib import Path

from aiohttp import web

from slurm_gpu_exporter import __version__
from slurm_gpu_exporter.agent.flags import DEFAULT_HWMON_ROOT, DEFAULT_LISTEN, build_parser
from slurm_gpu_exporter.agent.trust import (
    UntrustedPathError,
    check_private_dir,
    warn_if_web_config_exposed,
)
from slurm_gpu_exporter.exposition.snapshot import NodeIdentity
from slurm_gpu_exporter.gpu.backend import GpuBackend
from slurm_gpu_exporter.gpu.sampler import GpuSampler
from slurm_gpu_exporter.hooks import spool
from slurm_gpu_exporter.jobs.cpu_energy import CpuEnergySource
from slurm_gpu_exporter.jobs.node_energy import NodeEnergySource
from slurm_gpu_exporter.jobs.stats import JobStatsCollector
from slurm_gpu_exporter.jobs.tracker import JobTracker
from slurm_gpu_exporter.node.cgroup import CgroupFS
from slurm_gpu_exporter.node.hwmon import DEFAULT_METERS, HwmonPowerMeter
from slurm_gpu_exporter.node.power_command import PowerCommand
from slurm_gpu_exporter.node.powercap import PowercapReader
from slurm_gpu_exporter.node.slurm.conf import read_cluster_name, slurm_conf_path
from slurm_gpu_exporter.node.slurm.lookup import SlurmMetadata, make_lookup
from slurm_gpu_exporter.node.source_health import SourceErrors
from slurm_gpu_exporter.node.state_dir import StateStore
from slurm_gpu_exporter.sampling.sampler import Sampler
from slurm_gpu_exporter.training_relay import RelayLimits, TrainingRelay
from slurm_gpu_exporter.training_relay.source import RelayJobs, TrainingSource
from slurm_gpu_exporter.web.config import WebConfigError
from slurm_gpu_exporter.web.connections import (
    ConnectionLimits,
    connection_cap,
    held_files_budget,
)
from slurm_gpu_exporter.web.listen import (
    ListenError,
    parse_listen_address,
    ssl_context_of,
    start,
)
from slurm_gpu_exporter.web.logging_setup import AGENT_FORMAT, setup_logging
from slurm_gpu_exporter.web.reload import LiveWebConfig, watch_web_config
from slurm_gpu_exporter.web.serve import stop_signals
from slurm_gpu_exporter.web.server import ExpositionHolder, make_app

log = logging.getLogger("slurm_gpu_exporter")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["check"]:
        from slurm_gpu_exporter.check.command import main as check_main

        return check_main(argv[1:])
    args = build_parser().parse_args(argv)
    setup_logging(args.log_level, AGENT_FORMAT, throttle_clients=True)
    listen = args.listen or [DEFAULT_LISTEN]
    try:
        for address in listen:
            parse_listen_address(address)
        web_config = LiveWebConfig(args.web_config)
    except (ValueError, WebConfigError) as exc:
        log.error("%s", exc)
        return 2
    if args.web_config:
        warn_if_web_config_exposed(args.web_config, web_config.current)
    if args.max_connections < 1:
        log.error("--web.max-connections must be 1 or more")
        return 2
    cap = connection_cap(args.max_connections)
    if cap < args.max_connections:
        log.warning("serving at most %d HTTP connections, not %d: the file limit leaves no "
                    "more room; raise LimitNOFILE (ulimit -n)", cap, args.max_connections)
    limits = ConnectionLimits(max_connections=cap, header_timeout=args.header_timeout,
                              keepalive_timeout=args.header_timeout)

    with contextlib.ExitStack() as stack:
        simulation = None
        if args.simulate:
            from slurm_gpu_exporter.sim.simulate import SimulatedNode

            base = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="sge-sim-")))
            simulation = SimulatedNode(base)
            simulation.start()
            stack.callback(simulation.stop)
            args.cgroup_root, args.proc_root = simulation.cgroup_root, simulation.proc_root
            args.spool_dir, args.state_dir = str(simulation.spool_dir), simulation.state_dir
            args.powercap_root = str(simulation.powercap_root)
            if args.hwmon_root == DEFAULT_HWMON_ROOT:  # an explicit one stays (tests)
                args.hwmon_root = str(simulation.hwmon_root)
            log.info("simulating a node with %d GPUs under %s", simulation.gpu_count, base)

        trusted_uids = frozenset({0, os.geteuid()})
        try:
            check_private_dir(Path(args.spool_dir), "--spool-dir", trusted_uids)
            check_private_dir(args.state_dir, "--state-dir", trusted_uids)
        except UntrustedPathError as exc:
            log.error("refusing to start: %s", exc)
            return 2
        errors = SourceErrors()
        cgroups = CgroupFS(args.cgroup_root, held_files=held_files_budget(cap))
        if simulation is not None:
            lookup = simulation.slurm_lookup
        elif args.slurm_lookup == "off":
            lookup = None
        else:
            lookup = make_lookup(args.node_name, prefer_pyslurm=args.slurm_lookup == "auto")
        registry = JobTracker(
            args.spool_dir, cgroups, SlurmMetadata(lookup, errors=errors), errors,
            proc_root=args.proc_root, job_linger=args.job_linger,
            cgroup_grace=args.cgroup_grace, trusted_uids=trusted_uids,
        )
        jobstats = JobStatsCollector(cgroups, args.proc_root, errors)
        backend: GpuBackend
        if simulation is not None:
            from slurm_gpu_exporter.gpu.simulated import SimulatedBackend

            backend = SimulatedBackend(simulation.gpu_count, simulation.gpu_processes)
        else:
            from slurm_gpu_exporter.gpu.nvml import NvmlBackend

            backend = NvmlBackend()
        gpu = GpuSampler(backend, args.proc_root, errors, cgroups=cgroups,
                         poll_timeout=max(1.0, 0.8 * args.sample_interval))
        training = None
        if args.training_relay:
            training = _start_training_relay(args.spool_dir, args.proc_root, cgroups,
                                             args.sample_interval, errors)
        if training is not None:
            stack.callback(training.stop)
        cpu_energy = None
        if args.powercap_root:
            cpu_energy = CpuEnergySource(PowercapReader(Path(args.powercap_root)),
                                         args.proc_root, errors)
        node_energy = _node_energy(args, errors)
        if node_energy is not None and isinstance(node_energy.meter, PowerCommand):
            node_energy.meter.start()
            stack.callback(node_energy.meter.stop)
        holder = ExpositionHolder(stale_after=max(120.0, 10 * args.sample_interval))
        sampler = Sampler(
            registry, jobstats, errors, args.sample_interval,
            state=StateStore(args.state_dir), gpu=gpu, training=training,
            cpu_energy=cpu_energy, node_energy=node_energy, publish=holder.show,
            identity=_identity(args, simulation),
        )
        try:
            asyncio.run(_serve(make_app(holder, web_config, limits), listen, web_config, sampler,
                               args.web_config_reload))
        except ListenError as exc:
            log.error("%s; stop what uses it or pass another --web.listen-address", exc)
            return 1
    return 0


def _identity(args: argparse.Namespace, simulation: object | None) -> NodeIdentity:
    """Who the node is to Slurm: --node-name and slurm.conf's ClusterName (a simulated
    node is the one its files name, in no cluster of this host)."""
    if simulation is not None:
        from slurm_gpu_exporter.sim.simulate import NODE

        return NodeIdentity(NODE)
    return NodeIdentity(args.node_name, read_cluster_name(slurm_conf_path()))


def _node_energy(args: argparse.Namespace, errors: SourceErrors) -> NodeEnergySource | None:
    """The node power meter the flags ask for: the site command, else hwmon, else none."""
    meter: PowerCommand | HwmonPowerMeter
    if args.node_power_command:
        meter = PowerCommand(args.node_power_command, args.node_power_interval,
                             args.node_power_timeout)
    elif args.hwmon_root:
        meter = HwmonPowerMeter(Path(args.hwmon_root),
                                tuple(args.node_power_hwmon_names or DEFAULT_METERS))
    else:
        return None
    return NodeEnergySource(meter, errors)


def _start_training_relay(spool_dir: str, proc_root: Path, cgroups: CgroupFS,
                          sample_interval: float, errors: SourceErrors
                          ) -> TrainingSource | None:
    """Serve training.sock, or say in one line why not (the agent then runs without it)."""
    jobs = RelayJobs(proc_root, cgroups)
    # A job is known to the relay from the first sample after it starts: its first
    # connections wait that long, with room for a slow sample.
    limits = RelayLimits(pending_seconds=max(30.0, 3 * sample_interval))
    relay = TrainingRelay(spool_dir, jobs.job_of_pid, job_of_key=jobs.job_of_key,
                          limits=limits)
    try:
        os.close(spool.open_spool_dir(spool_dir, create=True))
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
    return TrainingSource(relay, jobs, errors)


async def _serve(app: web.Application, listen: list[str], web_config: LiveWebConfig,
                 sampler: Sampler, reload_interval: float) -> None:
    reread = asyncio.Event()
    async with stop_signals(on_hup=reread.set) as stop:
        runner = await start(app, listen, ssl_context_of(web_config))
        watcher = asyncio.create_task(watch_web_config(web_config, reload_interval, reread))
        sampler.start()
        log.info("slurm-gpu-exporter %s started; sampling every %g s", __version__,
                 sampler.interval)
        try:
            await stop.wait()
            log.info("stopping")
        finally:
            watcher.cancel()
            await runner.cleanup()
            await asyncio.get_running_loop().run_in_executor(None, sampler.stop)


if __name__ == "__main__":
    sys.exit(main())
