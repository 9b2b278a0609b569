"""The agent's HTTP application: its exposition routes, on the web layer every
server shares (middleware.py, listen.py).

``/metrics`` ships the last snapshot in the format and encoding the scraper asked
for, rendered at most once per snapshot and format (by the first scrape that asks,
off the event loop); it never reads NVML, /proc or cgroups. ``/-/healthy`` fails
until the first sample is done and whenever sampling is stuck; ``/-/ready``
succeeds once the first sample is there. Basic-auth bcrypt checks run off the
event loop, so a wrong password never stalls other scrapes. Connections are capped
and idle ones closed (connections.py): the app's middleware tells the guard when a
request is in progress.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from aiohttp import web

from slurm_gpu_exporter import __version__
from slurm_gpu_exporter.exposition.rendered import Exposition, render
from slurm_gpu_exporter.exposition.snapshot import Snapshot
from slurm_gpu_exporter.web.config import WebConfig
from slurm_gpu_exporter.web.connections import ConnectionGuard, ConnectionLimits
from slurm_gpu_exporter.web.middleware import auth_middleware, guarded_app
from slurm_gpu_exporter.web.reload import LiveWebConfig

TEXT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
OPENMETRICS_TYPE = "application/openmetrics-text; version=1.0.0; charset=utf-8"

LANDING_PAGE = """<!doctype html>
<html><head><title>slurm-gpu-exporter</title></head>
<body><h1>slurm-gpu-exporter {version}</h1>
<p>Per-job GPU, CPU and memory metrics of this Slurm node.</p>
<ul><li><a href="metrics">metrics</a></li><li><a href="-/healthy">healthy</a></li>
<li><a href="-/ready">ready</a></li></ul></body></html>
"""


@dataclass
class ExpositionHolder:
    """The latest snapshot's exposition, which keeps its own renders; replaced whole by
    the sampler (an atomic reference swap)."""

    current: Exposition | None = None
    # Sampling counts as stuck when the snapshot is older than this (seconds).
    stale_after: float = 300.0

    def publish(self, exposition: Exposition) -> None:
        self.current = exposition

    def show(self, snapshot: Snapshot) -> None:
        """Serve ``snapshot`` from now on; the sampler calls it with each sample, so the
        agent's own process figures are read with the sample, never by a scrape."""
        self.publish(render(snapshot))


def _accepted(header: str, wanted: str) -> bool:
    """True when an Accept or Accept-Encoding header lists ``wanted`` with a q above 0."""
    for part in header.split(","):
        name, *params = (p.strip() for p in part.split(";"))
        if name.lower() != wanted:
            continue
        for param in params:
            key, _, value = param.partition("=")
            if key.strip() == "q":
                try:
                    return float(value) > 0
                except ValueError:
                    return False
        return True
    return False


HOLDER = web.AppKey("exposition_holder", ExpositionHolder)


async def metrics(request: web.Request) -> web.Response:
    exposition = request.app[HOLDER].current
    if exposition is None:
        return web.Response(status=503, text="no sample taken yet; retry shortly\n")
    openmetrics = _accepted(request.headers.get("Accept", ""), "application/openmetrics-text")
    gzipped = _accepted(request.headers.get("Accept-Encoding", ""), "gzip")
    body = exposition.cached(openmetrics, gzipped)
    if body is None:
        # The first scrape of a snapshot in this format renders it: off the event
        # loop, so health checks and other scrapes are not held up meanwhile.
        body = await asyncio.get_running_loop().run_in_executor(
            None, exposition.body, openmetrics, gzipped)
    headers = {"Content-Type": OPENMETRICS_TYPE if openmetrics else TEXT_TYPE,
               "Vary": "Accept, Accept-Encoding"}
    if gzipped:
        headers["Content-Encoding"] = "gzip"
    return web.Response(body=body, headers=headers)


async def healthy(request: web.Request) -> web.Response:
    holder = request.app[HOLDER]
    exposition = holder.current
    if exposition is None:
        # Until a sample completes there is nothing to vouch for: a first sample
        # that never ends (a hung driver at start) must not look healthy.
        return web.Response(status=503, text="no sample completed yet; if this lasts, "
                            "sampling is stuck (see the agent's log)\n")
    if time.time() - exposition.timestamp > holder.stale_after:
        age = time.time() - exposition.timestamp
        return web.Response(status=503, text=f"last sample is {age:.0f} s old: sampling "
                            "is stuck (a hung NVML call?)\n")
    return web.Response(text="Healthy\n")


async def ready(request: web.Request) -> web.Response:
    if request.app[HOLDER].current is None:
        return web.Response(status=503, text="no sample taken yet\n")
    return web.Response(text="Ready\n")


async def landing(request: web.Request) -> web.Response:
    return web.Response(text=LANDING_PAGE.format(version=__version__),
                        content_type="text/html")


def make_app(holder: ExpositionHolder,
             web_config: WebConfig | LiveWebConfig | None = None,
             limits: ConnectionLimits | None = None) -> web.Application:
    """Build the aiohttp application (tests start it on a random port).

    With a LiveWebConfig, each request is checked against the config in force.
    ``limits`` bound the connections of the listeners ``listen.start`` opens."""
    live = web_config if isinstance(web_config, LiveWebConfig) else None
    fixed = web_config if isinstance(web_config, WebConfig) else WebConfig()
    guard = ConnectionGuard(limits or ConnectionLimits(), product="slurm-gpu-exporter")
    config_of = (lambda: live.current) if live is not None else (lambda: fixed)
    app = guarded_app(guard, auth_middleware(config_of, "slurm-gpu-exporter"))
    app[HOLDER] = holder
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/-/healthy", healthy)
    app.router.add_get("/-/ready", ready)
    app.router.add_get("/", landing)
    return app
