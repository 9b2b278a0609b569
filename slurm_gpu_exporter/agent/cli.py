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
import signal
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
from slurm_gpu_exporter.web.logthrottle import throttle_client_driven_logs
from slurm_gpu_exporter.web.reload import LiveWebConfig
from slurm_gpu_exporter.web.server import (
    ExpositionHolder,
    ListenError,
    make_app,
    parse_listen_address,
    start_server,
)

log = logging.getLogger("slurm_gpu_exporter")

def _setup_logging(level: str) -> None:
    logging.basicConfig(
        level={"warn": logging.WARNING}.get(level, getattr(logging, level.upper())),
        format="%(asctime)s level=%(levelname)s source=%(name)s msg=%(message)s",
        stream=sys.stderr,
    )
    throttle_client_driven_logs()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["check"]:
        from slurm_gpu_exporter.check.command import main as check_main

        return check_main(argv[1:])
    args = build_parser().parse_args(argv)
    _setup_logging(args.log_level)
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
        node = Node(args, CgroupFS(args.cgroup_root, held_files=held_files_budget(cap)),
                    errors, trusted_uids, stack, simulation)
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


async def _watch_web_config(web_config: LiveWebConfig, interval: float,
                            wake: asyncio.Event) -> None:
    """Re-read the web config every ``interval`` seconds, or at once when woken (SIGHUP).
    Without a web config file there is nothing to re-read: only SIGHUP wakes it."""
    loop = asyncio.get_running_loop()
    while True:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(wake.wait(), interval if web_config.path else None)
        wake.clear()
        # Off the event loop: loading certificates reads files.
        await loop.run_in_executor(None, web_config.check)


async def _serve(app: web.Application, listen: list[str], web_config: LiveWebConfig,
                 sampler: Sampler, reload_interval: float) -> None:
    stop, reread = asyncio.Event(), asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGHUP, reread.set)
    runner = await start_server(app, listen, web_config)
    watcher = asyncio.create_task(_watch_web_config(web_config, reload_interval, reread))
    sampler.start()
    log.info("slurm-gpu-exporter %s started; sampling every %g s", __version__, sampler.interval)
    try:
        await stop.wait()
        log.info("stopping")
    finally:
        watcher.cancel()
        await runner.cleanup()
        await loop.run_in_executor(None, sampler.stop)


if __name__ == "__main__":
    sys.exit(main())
