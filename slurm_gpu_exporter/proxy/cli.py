"""``slurm-gpu-proxy``: flags and wiring."""

from __future__ import annotations

import argparse
import asyncio
import logging
import shutil
import socket
import sys
from pathlib import Path

from slurm_gpu_exporter import __version__
from slurm_gpu_exporter.model.munge_wire import audience
from slurm_gpu_exporter.proxy.app import PRODUCT, make_app
from slurm_gpu_exporter.proxy.archive import ArchiveReader, ArchiveSetupError
from slurm_gpu_exporter.proxy.config import ConfigError, ProxyConfig, load_config
from slurm_gpu_exporter.proxy.fairness import FairLimits
from slurm_gpu_exporter.proxy.munge import DEFAULT_SOCKET, MungeDecoder
from slurm_gpu_exporter.proxy.observe import ProxyMetrics
from slurm_gpu_exporter.web.config import WebConfig, WebConfigError, load_web_config
from slurm_gpu_exporter.web.connections import (
    ConnectionGuard,
    ConnectionLimits,
    connection_cap,
)
from slurm_gpu_exporter.web.listen import Bound, ListenError, parse_listen_address, start
from slurm_gpu_exporter.web.logging_setup import PROXY_FORMAT, setup_logging
from slurm_gpu_exporter.web.serve import stop_signals

log = logging.getLogger("slurm_gpu_exporter.proxy")

DEFAULT_LISTEN = ":9818"
# Below the unit's LimitNOFILE (4096), with room for the upstream pool and files.
DEFAULT_MAX_CONNECTIONS = 1024
# The listen backlog: connections the kernel holds for the proxy to accept.
BACKLOG = 512
KEEPALIVE_TIMEOUT_S = 75.0
# How long the rest of a refused request's body is read so the client sees the answer.
LINGERING_TIME_S = 2.0
# A connection that sends no request within this closes (ConnectionGuard).
HEADER_TIMEOUT_S = 10.0
# A request in progress is closed past the store's timeout and this much more (waits
# for a check or a share of the store, reading the body).
REQUEST_GRACE_S = 60.0
# Half the default cap: one client (Grafana, or an attacker) keeps at most half of the
# connections even when all of its are in a request.
DEFAULT_MAX_PER_CLIENT = 512


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
    p.add_argument("--munge", action="store_true",
                   help="accept 'Authorization: Munge <credential>' made for this proxy "
                        "(its payload names it), decoded by the site's munged")
    p.add_argument("--munge.socket", dest="munge_socket", type=Path, default=DEFAULT_SOCKET,
                   help=f"munged's socket (default {DEFAULT_SOCKET})")
    p.add_argument("--munge.audience", dest="munge_audience", action="append", default=[],
                   metavar="URL", help="a URL clients reach the proxy by, which their munge "
                   "credentials must name (repeatable; default: this host's names on each "
                   "listen address's port)")
    p.add_argument("--archive.url", dest="archive_url", metavar="URL",
                   help="serve ended jobs from the job archive (sqlite:///PATH or "
                        "postgresql://…, read only) at /slurm-gpu/v1/jobs/<jobid>; needs "
                        "the archive extra")
    p.add_argument("--archive.timeout", dest="archive_timeout", type=float, default=10.0,
                   metavar="SECONDS", help="how long to wait for the archive (connection, "
                                           "locks; default 10)")
    limits = FairLimits()
    p.add_argument("--web.max-connections", dest="max_connections", type=int,
                   default=DEFAULT_MAX_CONNECTIONS, metavar="N",
                   help="open client connections at most; past half of it a new one closes "
                        f"the one idle the longest (default {DEFAULT_MAX_CONNECTIONS})")
    p.add_argument("--web.max-connections-per-client", dest="max_per_client", type=int,
                   default=DEFAULT_MAX_PER_CLIENT, metavar="N",
                   help="open connections from one client address at most (0: no cap of "
                        "its own); past it its own idle one is closed for its new one "
                        f"(default {DEFAULT_MAX_PER_CLIENT})")
    p.add_argument("--limits.checks-per-user", dest="checks_per_user", type=int,
                   default=limits.checks_per_user, metavar="N",
                   help="one user's queries being checked at once; more of theirs wait "
                        f"(default {limits.checks_per_user})")
    p.add_argument("--limits.upstream-per-user", dest="upstream_per_user", type=int,
                   default=limits.upstream_per_user, metavar="N",
                   help="one user's requests at the store at once; more of theirs wait "
                        f"(default {limits.upstream_per_user})")
    p.add_argument("--limits.waiting-per-user", dest="waiting_per_user", type=int,
                   default=limits.waiting_per_user, metavar="N",
                   help="how many more of one user's requests may wait for their share "
                        f"before 503 (default {limits.waiting_per_user})")
    p.add_argument("--limits.wait", dest="wait_seconds", type=float,
                   default=limits.wait_seconds, metavar="SECONDS",
                   help="how long a request waits for its user's share before 503 with "
                        f"Retry-After (default {limits.wait_seconds:g})")
    p.add_argument("--limits.backoff-max", dest="backoff_max", type=float,
                   default=limits.backoff_max_seconds, metavar="SECONDS",
                   help="the longest a user whose queries keep being killed for time "
                        "waits (429); the wait starts at "
                        f"{limits.backoff_first_seconds:g} s and doubles per kill "
                        f"(default {limits.backoff_max_seconds:g})")
    p.add_argument("--limits.upstream-body-bytes", dest="upstream_body_bytes", type=int,
                   default=limits.upstream_body_bytes, metavar="BYTES",
                   help="the largest answer taken from the store; larger ones are 502 "
                        f"(default {limits.upstream_body_bytes})")
    p.add_argument("--log.level", dest="log_level", default="info",
                   choices=["debug", "info", "warn", "error"])
    p.add_argument("--version", action="version", version=f"slurm-gpu-proxy {__version__}")
    return p


def munge_audiences(given: list[str], addresses: list[str], tls: bool) -> frozenset[str]:
    """The URLs a munge credential may name: the ``--munge.audience`` ones, else this
    host's names (short and fully qualified; a listen address's own host where it has
    one) on each listen address's port. Raises ValueError for a URL that is not one."""
    try:
        if given:
            return frozenset(audience(url) for url in given)
    except ValueError as exc:
        raise ValueError(f"--munge.audience: {exc}") from None
    scheme = "https" if tls else "http"
    found = set()
    for address in addresses:
        host, port = parse_listen_address(address)
        if host in (None, "0.0.0.0", "::"):
            hosts = {socket.gethostname(), socket.getfqdn()}
        else:
            hosts = {host}
        found |= {audience(f"{scheme}://{name if ':' not in name else f'[{name}]'}:{port}")
                  for name in hosts}
    return frozenset(found)


def fair_limits(args: argparse.Namespace) -> FairLimits:
    """The ``--limits.*`` flags; ValueError naming one that is out of range."""
    for flag, value in (("checks-per-user", args.checks_per_user),
                        ("upstream-per-user", args.upstream_per_user),
                        ("upstream-body-bytes", args.upstream_body_bytes)):
        if value < 1:
            raise ValueError(f"--limits.{flag} must be 1 or more")
    for flag, value in (("waiting-per-user", args.waiting_per_user),
                        ("wait", args.wait_seconds), ("backoff-max", args.backoff_max)):
        if not value >= 0:
            raise ValueError(f"--limits.{flag} must be 0 or more")
    if args.max_connections < 2:
        raise ValueError("--web.max-connections must be 2 or more")
    if args.max_per_client < 0:
        raise ValueError("--web.max-connections-per-client must be 0 or more")
    return FairLimits(checks_per_user=args.checks_per_user,
                      upstream_per_user=args.upstream_per_user,
                      waiting_per_user=args.waiting_per_user, wait_seconds=args.wait_seconds,
                      backoff_max_seconds=args.backoff_max,
                      upstream_body_bytes=args.upstream_body_bytes)


async def serve(config: ProxyConfig, web_config: WebConfig, addresses: list[str],
                munge_socket: Path | None = None,
                archive: ArchiveReader | None = None,
                audiences: frozenset[str] = frozenset(),
                limits: FairLimits | None = None,
                max_connections: int = DEFAULT_MAX_CONNECTIONS,
                max_per_client: int = DEFAULT_MAX_PER_CLIENT) -> int:
    metrics = ProxyMetrics()
    cap = connection_cap(max_connections)
    if cap < max_connections:
        log.warning("the file limit leaves room for %d connections, not %d; raise "
                    "LimitNOFILE", cap, max_connections)
    guard = ConnectionGuard(ConnectionLimits(
        max_connections=cap, max_per_client=max_per_client, header_timeout=HEADER_TIMEOUT_S,
        keepalive_timeout=KEEPALIVE_TIMEOUT_S,
        request_timeout=config.upstream_timeout + REQUEST_GRACE_S),
        product=PRODUCT, on_refused=metrics.connections_refused.inc)
    munge = MungeDecoder(munge_socket, audiences=audiences) if munge_socket else None
    if munge is not None:
        log.info("taking munge credentials made for %s", ", ".join(sorted(audiences)))
    if archive is not None:
        problem = await asyncio.to_thread(archive.check)
        if problem:  # it may be made later (the first archive run): serve, and say so
            log.warning("the job archive cannot be read yet: %s", problem)
        else:
            log.info("serving archived jobs from %s", archive.where)
    app = make_app(config, web_config, metrics, munge=munge, archive=archive, limits=limits,
                   guard=guard)

    def announce(bound: Bound) -> None:
        log.info("listening on %s (%s), forwarding to %s", bound.address,
                 "https" if bound.tls else "http", config.prometheus_url)

    try:
        # Setting the app up starts the query checkers (check_pool.py).
        runner = await start(app, addresses, web_config.ssl_context(), backlog=BACKLOG,
                             lingering_time=LINGERING_TIME_S, announce=announce)
    except ListenError as exc:
        log.error("%s; pick a free address", exc)
        return 1
    except OSError as exc:
        log.error("%s; check that slurm-gpu-exporter is installed for %s", exc,
                  sys.executable)
        return 1
    async with stop_signals() as stop:
        await stop.wait()
        await runner.cleanup()  # closes the listeners and the open connections
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(args.log_level, PROXY_FORMAT)
    try:
        config = load_config(args.config, args.prometheus_url, args.admin, args.public_metric)
        web_config = load_web_config(args.web_config) if args.web_config else WebConfig()
        addresses = args.listen or [DEFAULT_LISTEN]
        for address in addresses:
            parse_listen_address(address)
        audiences = (munge_audiences(args.munge_audience, addresses,
                                     web_config.tls is not None) if args.munge else frozenset())
        archive = (ArchiveReader(args.archive_url, args.archive_timeout)
                   if args.archive_url else None)
        limits = fair_limits(args)
    except (ConfigError, WebConfigError, ValueError, ArchiveSetupError) as exc:
        print(f"slurm-gpu-proxy: {exc}", file=sys.stderr)
        return 2
    if args.munge_audience and not args.munge:
        print("slurm-gpu-proxy: --munge.audience needs --munge", file=sys.stderr)
        return 2
    if not web_config.users and config.user_header is None and not args.munge:
        print("slurm-gpu-proxy: nobody could sign in: add basic_auth_users to "
              "--web.config.file, a user_header to --config, or --munge", file=sys.stderr)
        return 2
    if args.munge and shutil.which("unmunge") is None:
        print("slurm-gpu-proxy: --munge needs unmunge; install munge (Debian: apt-get "
              "install munge)", file=sys.stderr)
        return 2
    return asyncio.run(serve(config, web_config, addresses,
                             args.munge_socket if args.munge else None, archive, audiences,
                             limits, args.max_connections, args.max_per_client))


if __name__ == "__main__":
    sys.exit(main())
