"""``slurm-gpu-report remediate``: an Alertmanager webhook that drains nodes whose GPU failed.

Only firing alerts named in the allow-list act (by default the shipped critical GPU
faults: fallen off the bus, an Xid that needs a reset, uncorrected ECC). Each alert
acts once (by its fingerprint and start); a node already drained is left as it is,
so an admin's reason is never overwritten; nothing here ever resumes a node. Label
values come from whoever can post, so the node name must be a plain host name and
every value put in the reason is reduced to safe characters.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from slurm_gpu_exporter.report.errors import ReportError
from slurm_gpu_exporter.report.prometheus.queries import node_name
from slurm_gpu_exporter.report.slurm.actions import NODE_RE, drain_node, inert, node_state
from slurm_gpu_exporter.web.config import WebConfig
from slurm_gpu_exporter.web.connections import ConnectionGuard, ConnectionLimits
from slurm_gpu_exporter.web.server import GUARD_KEY, auth_middleware, guard_middleware

log = logging.getLogger(__name__)

DEFAULT_ALERTS = ("SlurmGpuLost", "SlurmGpuXidResetRequired", "SlurmGpuEccUncorrected")
MAX_BODY_BYTES = 1 << 20
HEALTH_PATHS = frozenset({"/-/healthy", "/-/ready"})
REMEMBERED_ALERTS = 10_000  # alerts acted on, kept to act once each (oldest forgotten)


@dataclass
class Remediator:
    """Turns the alerts of one webhook post into drains."""

    allowed: frozenset[str] = frozenset(DEFAULT_ALERTS)
    node_label: str = "instance"
    dry_run: bool = False
    drain: Callable[[str, str], None] = drain_node
    state_of: Callable[[str], str] = node_state
    _done: OrderedDict[str, None] = field(default_factory=OrderedDict)

    def handle(self, alert: dict[str, Any]) -> str:
        """Act on one alert; the outcome in a few words (also logged when it acted)."""
        labels = alert.get("labels")
        if not isinstance(labels, dict):
            return "ignored: no labels"
        name = str(labels.get("alertname", ""))
        if alert.get("status") != "firing":
            return "ignored: not firing (remediate never resumes a node)"
        if name not in self.allowed:
            return "ignored: alert not in the allow-list"
        key = str(alert.get("fingerprint") or json.dumps(labels, sort_keys=True)) + \
            "@" + str(alert.get("startsAt", ""))
        if key in self._done:
            return "ignored: acted on this alert before"
        node = node_name(str(labels.get(self.node_label, "")))
        if not NODE_RE.fullmatch(node):
            log.warning("refused %s: the %s label %r is not a node name", name,
                        self.node_label, node)
            return "refused: not a node name"
        reason = inert(f"slurm-gpu-exporter {name} gpu {labels.get('gpu', '?')} "
                       f"{labels.get('uuid', '')} xid {labels.get('xid', '-')} since "
                       f"{alert.get('startsAt', '?')}")
        try:
            state = self.state_of(node)
            if "DRAIN" in state.upper():
                self._remember(key)
                return f"ignored: {node} is already {state}"
            if self.dry_run:
                log.info("dry run: would drain %s: %s", node, reason)
                return f"dry run: would drain {node}"
            self.drain(node, reason)
        except ReportError as exc:
            log.error("cannot drain %s for %s: %s", node, name, exc)
            return f"failed: {exc}"
        self._remember(key)
        log.info("drained %s: %s", node, reason)
        return f"drained {node}"

    def _remember(self, key: str) -> None:
        self._done[key] = None
        while len(self._done) > REMEMBERED_ALERTS:
            self._done.popitem(last=False)


def make_app(remediator: Remediator, web_config: WebConfig | None = None) -> web.Application:
    """The receiver: ``POST /alerts`` (Alertmanager's webhook), ``GET /-/healthy``."""
    config = web_config or WebConfig()
    lock = asyncio.Lock()  # one post at a time: a node is looked at, then drained
    # The agent's listener rules: a connection cap, header and idle timeouts.
    guard = ConnectionGuard(ConnectionLimits())

    async def alerts(request: web.Request) -> web.Response:
        try:
            payload = await request.json()
        except (ValueError, UnicodeDecodeError):
            return web.Response(status=400, text="the body is not JSON: post Alertmanager's "
                                                 "webhook payload\n")
        items = payload.get("alerts") if isinstance(payload, dict) else None
        if not isinstance(items, list) or not all(isinstance(a, dict) for a in items):
            return web.Response(status=400, text="no alerts list: post Alertmanager's "
                                                 "webhook payload\n")
        async with lock:
            loop = asyncio.get_running_loop()
            # scontrol blocks: off the event loop, so health checks still answer.
            outcomes = [await loop.run_in_executor(None, remediator.handle, a) for a in items]
        return web.json_response({"results": outcomes})

    async def healthy(request: web.Request) -> web.Response:
        return web.Response(text="Healthy\n")

    # Health probes say nothing but "up": no secret needed for them.
    security = auth_middleware(lambda: config, "slurm-gpu-report remediate",
                               HEALTH_PATHS)
    app = web.Application(middlewares=[guard_middleware(guard), security],
                          client_max_size=MAX_BODY_BYTES)
    app[GUARD_KEY] = guard
    app.router.add_post("/alerts", alerts)
    app.router.add_get("/-/healthy", healthy)
    app.router.add_get("/-/ready", healthy)
    return app
