"""The ``remediate`` subcommand: flags, the web config, and serving until SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from pathlib import Path

from slurm_gpu_exporter.report.remediate.webhook import DEFAULT_ALERTS, Remediator, make_app
from slurm_gpu_exporter.web.config import WebConfig, WebConfigError, load_web_config
from slurm_gpu_exporter.web.server import ListenError, start_server

DEFAULT_LISTEN = "127.0.0.1:9818"


def add_remediate_command(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """``remediate`` and its flags (the agent's web flags, same meaning)."""
    remediate = sub.add_parser(
        "remediate", help="Alertmanager webhook: drain nodes whose GPU failed")
    remediate.add_argument("--web.listen-address", dest="listen", action="append",
                           help=f"address to listen on, repeatable (default {DEFAULT_LISTEN})")
    remediate.add_argument("--web.config.file", dest="web_config",
                           help="TLS and basic auth, in the agent's web config format")
    remediate.add_argument("--dry-run", action="store_true",
                           help="log the drains it would do, do none")
    remediate.add_argument("--node-label", default="instance",
                           help="the alert label naming the Slurm node (a port is dropped; "
                                "default instance)")
    remediate.add_argument("--alert", dest="alerts", action="append", metavar="ALERTNAME",
                           help="alert that drains its node, repeatable (default: "
                                f"{', '.join(DEFAULT_ALERTS)})")


async def _serve(args: argparse.Namespace, web_config: WebConfig) -> None:
    remediator = Remediator(allowed=frozenset(args.alerts or DEFAULT_ALERTS),
                            node_label=args.node_label, dry_run=args.dry_run)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    listen = args.listen or [DEFAULT_LISTEN]
    runner = await start_server(make_app(remediator, web_config), listen, web_config)
    logging.getLogger(__name__).info(
        "receiving Alertmanager's webhook at POST /alerts on %s%s", ", ".join(listen),
        " (dry run: no node is drained)" if args.dry_run else "")
    try:
        await stop.wait()
    finally:
        await runner.cleanup()


def run_remediate(args: argparse.Namespace) -> int:
    """Serve until SIGTERM; 2 for a bad web config or address."""
    logging.getLogger("slurm_gpu_exporter").setLevel(logging.INFO)
    try:
        web_config = load_web_config(Path(args.web_config)) if args.web_config else WebConfig()
        if not web_config.users and not web_config.tls:
            logging.getLogger(__name__).warning(
                "remediate runs without basic auth or TLS: anyone who can reach it can drain "
                "nodes; set --web.config.file")
        asyncio.run(_serve(args, web_config))
    except (WebConfigError, ListenError, ValueError) as exc:
        print(f"slurm-gpu-report: {exc}", file=sys.stderr)
        return 2
    return 0
