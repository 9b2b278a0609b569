"""``slurm-gpu-report remediate``'s HTTP side: Alertmanager's webhook at ``POST /alerts``,
its own counters at ``GET /metrics``, health at ``GET /-/healthy``.

A post is handled whole under one lock (a node is looked at, then drained): the alerts
that need it are confirmed with one Prometheus query, then the post goes to the
``Remediator`` (``remediator.py``), off the event loop since scontrol blocks. Where
Prometheus could not be asked the answer is 503, so Alertmanager sends the post again.
Where a node was drained for new firings, the jobs on the faulty GPU are handed to the
``Requeuer`` (``--requeue-opt``) before the answer: it signals them and schedules their
requeues, never waiting out the grace here. A repeat of a firing acted on before is
handed to it too: where its look-up failed before, it tries again. Where the look-up
fails, the answer is 503 as well, so Alertmanager posts again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from aiohttp import web

from slurm_gpu_exporter.report.errors import ReportError
from slurm_gpu_exporter.report.inert_text import plain
from slurm_gpu_exporter.report.remediate.confirm import Firing
from slurm_gpu_exporter.report.remediate.observe import RemediateMetrics
from slurm_gpu_exporter.report.remediate.remediator import Outcome, Remediator
from slurm_gpu_exporter.report.remediate.requeuer import Requeuer
from slurm_gpu_exporter.web.config import WebConfig
from slurm_gpu_exporter.web.connections import ConnectionGuard, ConnectionLimits
from slurm_gpu_exporter.web.middleware import auth_middleware, guarded_app

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 1 << 20
HEALTH_PATHS = frozenset({"/-/healthy", "/-/ready"})


async def outcomes_of(remediator: Remediator, items: list[dict],  # type: ignore[type-arg]
                      confirm: Callable[[], Awaitable[Firing]]) -> list[Outcome]:
    """Each alert's outcome; Prometheus is asked once, and only when an alert needs it."""
    firing: Firing | None = {}
    if remediator.needs_prometheus(items):
        try:
            firing = await confirm()
        except ReportError as exc:
            log.error("cannot confirm alerts with Prometheus, nothing drained: %s",
                      plain(exc))
            firing = None
    # scontrol blocks: off the event loop, so health checks still answer.
    return await asyncio.get_running_loop().run_in_executor(
        None, remediator.decide, items, firing)


@dataclass
class Receiver:
    """What the webhook's handlers share (``request.app[RECEIVER]``); a post is
    handled whole under ``lock``."""

    remediator: Remediator
    confirm: Callable[[], Awaitable[Firing]]
    counters: RemediateMetrics
    requeuer: Requeuer | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


RECEIVER = web.AppKey("remediate_receiver", Receiver)


def make_app(remediator: Remediator, confirm: Callable[[], Awaitable[Firing]],
             web_config: WebConfig | None = None,
             metrics: RemediateMetrics | None = None,
             requeuer: Requeuer | None = None) -> web.Application:
    """The receiver: ``POST /alerts`` (Alertmanager's webhook), ``GET /metrics``,
    ``GET /-/healthy``."""
    config = web_config or WebConfig()
    counters = metrics or RemediateMetrics(remediator.budget, remediator.clock)
    if requeuer is not None:
        requeuer.count = counters.count_job  # its jobs are counted beside the alerts
    # The agent's listener rules: a connection cap, header and idle timeouts.
    guard = ConnectionGuard(ConnectionLimits(), product="slurm-gpu-report remediate")
    # Health probes say nothing but "up": no secret needed for them.
    security = auth_middleware(lambda: config, "slurm-gpu-report remediate",
                               HEALTH_PATHS)
    app = guarded_app(guard, security, client_max_size=MAX_BODY_BYTES)
    app[RECEIVER] = Receiver(remediator, confirm, counters, requeuer)
    app.router.add_post("/alerts", alerts)
    app.router.add_get("/metrics", exposition)
    app.router.add_get("/-/healthy", healthy)
    app.router.add_get("/-/ready", healthy)
    return app


async def alerts(request: web.Request) -> web.Response:
    """Alertmanager's post: each alert's outcome; 503 where Prometheus could not confirm."""
    receiver = request.app[RECEIVER]
    try:
        payload = await request.json()
    except (ValueError, UnicodeDecodeError):
        return web.Response(status=400, text="the body is not JSON: post Alertmanager's "
                                             "webhook payload\n")
    items = payload.get("alerts") if isinstance(payload, dict) else None
    if not isinstance(items, list) or not all(isinstance(a, dict) for a in items):
        return web.Response(status=400, text="no alerts list: post Alertmanager's "
                                             "webhook payload\n")
    async with receiver.lock:
        outcomes = await outcomes_of(receiver.remediator, items, receiver.confirm)
        faults = [o.fault for o in outcomes if o.fault is not None]
        settled = True
        if receiver.requeuer is not None and faults:
            settled = await receiver.requeuer.on_faults(faults)
    for outcome in outcomes:
        receiver.counters.count(outcome.outcome, outcome.reason)
    unconfirmed = any(o.reason == "prometheus_unavailable" for o in outcomes)
    results = [o.text for o in outcomes]
    if not settled:
        results.append("failed: cannot look up the jobs on the faulty GPU; post again")
    return web.json_response({"results": results},
                             status=503 if unconfirmed or not settled else 200)


async def exposition(request: web.Request) -> web.Response:
    return web.Response(body=request.app[RECEIVER].counters.render(),
                        content_type="text/plain", charset="utf-8",
                        headers={"X-Content-Type-Options": "nosniff"})


async def healthy(request: web.Request) -> web.Response:
    return web.Response(text="Healthy\n")
