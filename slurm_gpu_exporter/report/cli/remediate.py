"""The ``remediate`` subcommand: flags, the start-up checks, and serving until SIGTERM.

It takes the report's Prometheus flags (``--prometheus-url`` …): the store whose
``ALERTS`` series confirm each alert before a drain. Served on an address other hosts
can reach, it needs client authentication (basic auth users or required client
certificates in ``--web.config.file``), or ``--insecure-no-auth`` said on purpose.
With ``--requeue-opt all|opt-in`` the jobs on a faulty GPU are signalled and requeued
(``report/remediate/requeuer.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import logging
import sys
import time
from collections.abc import Callable
from pathlib import Path

from slurm_gpu_exporter.report.errors import ReportError
from slurm_gpu_exporter.report.figures.window import parse_duration
from slurm_gpu_exporter.report.prometheus.client import PrometheusClient
from slurm_gpu_exporter.report.remediate.budget import DrainBudget
from slurm_gpu_exporter.report.remediate.confirm import ALERT_NAME_RE, firing_alerts
from slurm_gpu_exporter.report.remediate.memory import ActedOn
from slurm_gpu_exporter.report.remediate.pending import RequeueBook, requeue_state_path
from slurm_gpu_exporter.report.remediate.remediator import (
    DEFAULT_ALERTS,
    DEFAULT_MAX_ALERTS,
    Remediator,
)
from slurm_gpu_exporter.report.remediate.requeue_policy import POLICIES, RequeuePolicy
from slurm_gpu_exporter.report.remediate.requeuer import RETRY_FOR_S, Requeuer
from slurm_gpu_exporter.report.remediate.webhook import make_app
from slurm_gpu_exporter.report.slurm.actions import SIGNAL_SCOPES
from slurm_gpu_exporter.web.config import WebConfig, WebConfigError, load_web_config
from slurm_gpu_exporter.web.listen import (
    ListenError,
    parse_listen_address,
    ssl_context_of,
    start,
)
from slurm_gpu_exporter.web.logging_setup import setup_logging
from slurm_gpu_exporter.web.serve import stop_signals

DEFAULT_LISTEN = "127.0.0.1:9818"
DEFAULT_MAX_DRAINS = 2
DEFAULT_DRAIN_WINDOW = "1h"
DEFAULT_STATE = "/var/lib/slurm-gpu-report/remediate.json"
DEFAULT_REQUEUE_GRACE = 120.0
# The client certificate setting that authenticates every client.
CLIENT_CERT_REQUIRED = "RequireAndVerifyClientCert"

log = logging.getLogger(__name__)


def add_remediate_command(sub: argparse._SubParsersAction  # type: ignore[type-arg]
                          ) -> argparse.ArgumentParser:
    """``remediate`` and its own flags (the agent's web flags, same meaning); the caller
    adds the report's Prometheus flags."""
    remediate = sub.add_parser(
        "remediate", help="Alertmanager webhook: drain nodes whose GPU failed")
    remediate.add_argument("--web.listen-address", dest="listen", action="append",
                           help=f"address to listen on, repeatable (default {DEFAULT_LISTEN})")
    remediate.add_argument("--web.config.file", dest="web_config",
                           help="TLS and basic auth, in the agent's web config format")
    remediate.add_argument("--insecure-no-auth", action="store_true",
                           help="serve on a non-loopback address without client "
                                "authentication (anyone who reaches it may post alerts)")
    remediate.add_argument("--dry-run", action="store_true",
                           help="log the drains it would do, do none")
    remediate.add_argument("--node-label", metavar="LABEL",
                           help="the alert label naming the Slurm node, where the scrape "
                                "config sets one (a port is dropped); default: the node the "
                                "alert's target names in slurm_gpu_exporter_node_info, else "
                                "the target's host")
    remediate.add_argument("--alert", dest="alerts", action="append", metavar="ALERTNAME",
                           help="alert that drains its node, repeatable (default: "
                                f"{', '.join(DEFAULT_ALERTS)})")
    remediate.add_argument("--max-drains", type=int, default=DEFAULT_MAX_DRAINS,
                           help="drains allowed per --drain-window; past it alerts are "
                                f"refused and counted (default {DEFAULT_MAX_DRAINS})")
    remediate.add_argument("--drain-window", default=DEFAULT_DRAIN_WINDOW,
                           help=f"the sliding window of --max-drains (default "
                                f"{DEFAULT_DRAIN_WINDOW})")
    remediate.add_argument("--max-alerts-per-post", type=int, default=DEFAULT_MAX_ALERTS,
                           help="alerts of one post acted on; the rest are refused and "
                                f"counted (default {DEFAULT_MAX_ALERTS})")
    remediate.add_argument("--state-file", default=DEFAULT_STATE,
                           help="the firing episodes acted on, kept across restarts "
                                f"(default {DEFAULT_STATE}; not written with --dry-run)")
    requeue = remediate.add_argument_group(
        "jobs on a faulty GPU (off by default; docs/enforce.md)")
    requeue.add_argument("--requeue-opt", choices=POLICIES, default="off",
                         help="signal, then requeue, the jobs holding the faulty GPU of a "
                              "node it drains: every job (all; a job opts out with "
                              "--comment=slurm-gpu:no-requeue), only jobs that opt in with "
                              "--comment=slurm-gpu:requeue (opt-in), or none (off, default)")
    # Defaults None: given without --requeue-opt they stop the start (_policy).
    requeue.add_argument("--requeue-signal", metavar="SIGNAL",
                         help="the signal they get first (default USR1; NONE: requeue at "
                              "once)")
    requeue.add_argument("--requeue-grace", type=float, metavar="SECONDS",
                         help="time between the signal and the requeue, for a checkpoint "
                              f"(default {DEFAULT_REQUEUE_GRACE:g})")
    requeue.add_argument("--requeue-signal-to", choices=tuple(SIGNAL_SCOPES),
                         help="which processes get the signal: the batch script (batch), "
                              "every step but it (steps), or all of them (full, default)")
    requeue.add_argument("--requeue-retry-for", type=float, metavar="SECONDS",
                         help="how long past its due time a failed requeue is retried, "
                              "every 30 s (default "
                              f"{RETRY_FOR_S:g}: longer than a slurmctld failover)")
    return remediate


def _loopback(address: str) -> bool:
    host, _ = parse_listen_address(address)
    if host is None:
        return False  # ":9818" is every address
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name: whatever it resolves to


def client_authenticated(config: WebConfig) -> bool:
    """Whether the web config makes every client prove who it is."""
    return bool(config.users) or (
        config.tls is not None and config.tls.client_auth_type == CLIENT_CERT_REQUIRED)


def check_exposure(listen: list[str], config: WebConfig, insecure: bool) -> None:
    """Refuse (ReportError) to serve other hosts without client authentication; warn
    where only this host can post."""
    if client_authenticated(config):
        return
    exposed = [a for a in listen if not _loopback(a)]
    if exposed and not insecure:
        raise ReportError(f"refusing to listen on {', '.join(exposed)} without client "
                          "authentication: anyone who reaches it could post alerts; set "
                          "basic_auth_users or client_auth_type: RequireAndVerifyClientCert "
                          "in --web.config.file (or give --insecure-no-auth)")
    log.warning("remediate runs without client authentication (basic auth or required "
                "client certificates): anyone who can reach it can post alerts; set "
                "--web.config.file")


async def _serve(args: argparse.Namespace, web_config: WebConfig,
                 prom: PrometheusClient, remediator: Remediator, book: RequeueBook) -> None:
    allowed = remediator.allowed
    listen = args.listen or [DEFAULT_LISTEN]
    async with stop_signals() as stop, prom:
        policy = _policy(args)
        requeuer = Requeuer(policy, book, lambda q: prom.instant(q, time.time()),
                            node_label=args.node_label, dry_run=args.dry_run,
                            retry_for_s=_retry_for(args))
        if policy.enabled:  # an episode's requeue work is open before it is remembered
            remediator.opening = lambda fault, now: book.opened(
                (e for e, _ in fault.episodes), now)
        app = make_app(remediator, lambda: firing_alerts(prom, allowed, args.node_label),
                       web_config, requeuer=requeuer)
        requeuer.resume()  # the requeues a previous run left due
        runner = await start(app, listen, ssl_context_of(web_config))
        log.info("receiving Alertmanager's webhook at POST /alerts on %s, confirming alerts "
                 "with %s%s", ", ".join(listen), prom.conn.url,
                 " (dry run: no node is drained)" if args.dry_run else "")
        try:
            await stop.wait()
        finally:
            await runner.cleanup()
            await requeuer.close()


def _remediator(args: argparse.Namespace) -> Remediator:
    """The Remediator the flags ask for, with what it acted on before (read here: a
    broken state file stops the start)."""
    if args.max_alerts_per_post < 1:
        raise ReportError("bad --max-alerts-per-post: give 1 or more")
    budget = _budget(args)
    # A dry run remembers in memory only: it never changes what the real one knows.
    acted_on = ActedOn(None if args.dry_run else Path(args.state_file))
    return Remediator(allowed=frozenset(args.alerts or DEFAULT_ALERTS),
                      node_label=args.node_label, dry_run=args.dry_run, budget=budget,
                      acted_on=acted_on, max_alerts=args.max_alerts_per_post)


_REQUEUE_FLAGS = (("requeue_signal", "--requeue-signal"),
                  ("requeue_grace", "--requeue-grace"),
                  ("requeue_signal_to", "--requeue-signal-to"),
                  ("requeue_retry_for", "--requeue-retry-for"))


def _policy(args: argparse.Namespace) -> RequeuePolicy:
    """The requeue policy the flags ask for; ReportError for a bad one, or for a requeue
    flag given while the policy is off (it would signal no one, silently)."""
    given = [flag for dest, flag in _REQUEUE_FLAGS if getattr(args, dest) is not None]
    if given and args.requeue_opt == "off":
        raise ReportError(f"{', '.join(given)} given without --requeue-opt all|opt-in: no "
                          "job would be signalled or requeued; add --requeue-opt or drop "
                          f"{'them' if len(given) > 1 else 'it'}")
    signal_name = str(args.requeue_signal or "USR1").upper().removeprefix("SIG")
    grace = DEFAULT_REQUEUE_GRACE if args.requeue_grace is None else args.requeue_grace
    try:
        return RequeuePolicy(args.requeue_opt, signal_name, grace,
                             args.requeue_signal_to or "full")
    except ValueError as exc:
        raise ReportError(str(exc)) from None


def _retry_for(args: argparse.Namespace) -> float:
    if args.requeue_retry_for is None:
        return RETRY_FOR_S
    if not 0 <= args.requeue_retry_for <= 7 * 86400:
        raise ReportError("bad --requeue-retry-for: give 0 to 604800 seconds")
    return float(args.requeue_retry_for)


def _book(args: argparse.Namespace) -> RequeueBook:
    """What was signalled and is due, read at start (a broken file stops it)."""
    return RequeueBook(None if args.dry_run else requeue_state_path(Path(args.state_file)))


def _budget(args: argparse.Namespace) -> DrainBudget:
    if args.max_drains < 0:
        raise ReportError("bad --max-drains: give 0 or more")
    for name in args.alerts or ():
        if not ALERT_NAME_RE.fullmatch(name):
            raise ReportError(f"bad --alert {name!r}: not an alert name")
    return DrainBudget(args.max_drains, parse_duration(args.drain_window))


def run_remediate(args: argparse.Namespace,
                  prometheus: Callable[[argparse.Namespace], PrometheusClient]) -> int:
    """Serve until SIGTERM; 2 for a bad flag, web config or address, an exposed
    listener without client authentication, or a state file it cannot read."""
    setup_logging("info")  # on slurm-gpu-report's own handler (cli/main.py)
    try:
        remediator = _remediator(args)
        _policy(args)  # a bad requeue flag stops the start, before it listens
        _retry_for(args)
        book = _book(args)
        web_config = load_web_config(Path(args.web_config)) if args.web_config else WebConfig()
        check_exposure(args.listen or [DEFAULT_LISTEN], web_config, args.insecure_no_auth)
        asyncio.run(_serve(args, web_config, prometheus(args), remediator, book))
    except ReportError as exc:
        print(f"slurm-gpu-report: {exc}", file=sys.stderr)
        return exc.exit_code
    except (WebConfigError, ListenError, ValueError) as exc:
        print(f"slurm-gpu-report: {exc}", file=sys.stderr)
        return 2
    return 0
