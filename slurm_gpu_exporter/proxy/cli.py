"""``slurm-gpu-proxy``: flags and wiring."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
import threading
from pathlib import Path

from aiohttp import web

from slurm_gpu_exporter import __version__
from slurm_gpu_exporter.proxy.app import make_app
from slurm_gpu_exporter.proxy.config import ConfigError, ProxyConfig, load_config
from slurm_gpu_exporter.webconfig import WebConfig, WebConfigError, load_web_config

log = logging.getLogger("slurm_gpu_exporter.proxy")

DEFAULT_LISTEN = ":9818"
# The PromQL parser recurses per level of a query; the largest query it is given
# (enforce.MAX_QUERY_BYTES) needs well under this.
PARSER_STACK_BYTES = 64 * 1024 * 1024


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="slurm-gpu-proxy",
        description="PromQL-enforcing access proxy: each user sees only the series of "
                    "their own Slurm jobs; admins see everything (docs/proxy.md).")
    p.add_argument("--prometheus-url", help="base URL of the Prometheus HTTP API to guard "
                   "(Prometheus, Thanos, VictoriaMetrics, Mimir)")
    p.add_argument("--web.listen-address", dest="listen", action="append",
                   help=f"address to listen on (repeatable; default {DEFAULT_LISTEN})")
    p.add_argument("--web.config.file", dest="web_config", type=Path,
                   help="exporter-toolkit web config: TLS, client certificates, bcrypt "
                        "basic-auth users")
    p.add_argument("--admin", nargs="+", action="extend", default=[], metavar="NAME",
                   help="users who see every series and every endpoint")
    p.add_argument("--public-metric", nargs="+", action="extend", default=[],
                   metavar="NAME", help="metric families every user sees whole "
                   "(cluster-wide aggregates)")
    p.add_argument("--config", type=Path, help="YAML file with the same settings, plus "
                   "coordinators and the trusted user header")
    p.add_argument("--log.level", dest="log_level", default="info",
                   choices=["debug", "info", "warn", "error"])
    p.add_argument("--version", action="version", version=f"slurm-gpu-proxy {__version__}")
    return p


def _listen_address(address: str) -> tuple[str | None, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"listen address {address!r} is not [host]:port")
    return (host.strip("[]") or None), int(port)


async def serve(config: ProxyConfig, web_config: WebConfig, addresses: list[str]) -> int:
    runner = web.AppRunner(make_app(config, web_config), access_log=None,
                           handle_signals=False, keepalive_timeout=75)
    await runner.setup()
    ssl_context = web_config.ssl_context()
    for address in addresses:
        host, port = _listen_address(address)
        site = web.TCPSite(runner, host, port, ssl_context=ssl_context, reuse_address=True)
        try:
            await site.start()
        except OSError as exc:
            await runner.cleanup()
            reason = os.strerror(exc.errno) if exc.errno else str(exc)
            log.error("cannot listen on %s: %s; pick a free address", address, reason)
            return 1
        log.info("listening on %s://%s:%d, forwarding to %s",
                 "https" if ssl_context else "http", host or "0.0.0.0", port,
                 config.prometheus_url)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await runner.cleanup()
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    level = {"warn": "WARNING"}.get(args.log_level, args.log_level.upper())
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s",
                        stream=sys.stderr)
    try:
        config = load_config(args.config, args.prometheus_url, args.admin, args.public_metric)
        web_config = load_web_config(args.web_config) if args.web_config else WebConfig()
        addresses = args.listen or [DEFAULT_LISTEN]
        for address in addresses:
            _listen_address(address)
    except (ConfigError, WebConfigError, ValueError) as exc:
        print(f"slurm-gpu-proxy: {exc}", file=sys.stderr)
        return 2
    if not web_config.users and config.user_header is None:
        print("slurm-gpu-proxy: nobody could sign in: add basic_auth_users to "
              "--web.config.file or a user_header to --config", file=sys.stderr)
        return 2
    threading.stack_size(PARSER_STACK_BYTES)
    return asyncio.run(serve(config, web_config, addresses))


if __name__ == "__main__":
    sys.exit(main())
