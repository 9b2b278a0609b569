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
from slurm_gpu_exporter.agent.sources import Node, build_sources
from slurm_gpu_exporter.agent.trust import (
    UntrustedPathError,
    check_private_dir,
    warn_if_web_config_exposed,
)
from slurm_gpu_exporter.exposition.snapshot import NodeIdentity
from slurm_gpu_exporter.node.cgroup import CgroupFS
from slurm_gpu_exporter.node.slurm.conf import read_cluster_name, slurm_conf_path
from slurm_gpu_exporter.node.source_health import SourceErrors
from slurm_gpu_exporter.node.state_dir import StateStore
from slurm_gpu_exporter.sampling.sampler import Sampler
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
        stack.callback(cgroups.close)  # its held files and inotify fd, after the sampler
        node = Node(args, cgroups, errors, trusted_uids, stack, simulation)
        sources = build_sources(node)
        holder = ExpositionHolder(stale_after=max(120.0, 10 * args.sample_interval))
        sampler = Sampler(sources, errors, args.sample_interval,
                          state=StateStore(args.state_dir), publish=holder.show,
                          identity=_identity(args, simulation))
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
