"""The HTTP side: the only module that knows HTTP.

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
import logging
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from aiohttp import web

from slurm_gpu_exporter import __version__
from slurm_gpu_exporter.exposition.rendered import Exposition, render
from slurm_gpu_exporter.exposition.snapshot import Snapshot
from slurm_gpu_exporter.web.config import AuthBusy, WebConfig
from slurm_gpu_exporter.web.connections import ACCEPT_BATCH, ConnectionGuard, ConnectionLimits
from slurm_gpu_exporter.web.reload import LiveWebConfig

log = logging.getLogger(__name__)

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


GUARD_KEY = web.AppKey("connection_guard", ConnectionGuard)


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def guard_middleware(guard: ConnectionGuard) -> Callable[..., Awaitable[web.StreamResponse]]:
    """Marks each request in progress on its connection, so the guard (connection cap,
    header and idle timeouts) never closes a connection that is being answered."""

    @web.middleware
    async def in_progress(request: web.Request, handler: Handler) -> web.StreamResponse:
        with guard.request(request.transport):
            return await handler(request)

    return in_progress


def auth_middleware(config_of: Callable[[], WebConfig], realm: str,
                    open_paths: frozenset[str] = frozenset()
                    ) -> Callable[..., Awaitable[web.StreamResponse]]:
    """The web config's client certificates and basic auth, and its response headers,
    on every path but ``open_paths`` (health probes that say nothing but "up")."""

    @web.middleware
    async def authenticated(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path in open_paths:
            return await handler(request)
        config = config_of()
        transport = request.transport
        peercert = transport.get_extra_info("peercert") if transport else None
        if not config.client_cert_allowed(peercert):
            return web.Response(status=403, text="client certificate not allowed\n")
        try:
            allowed = await config.check_basic_auth_async(request.headers.get("Authorization"))
        except AuthBusy:
            return web.Response(status=503, text="too many password checks in progress; "
                                "retry in a second\n", headers={"Retry-After": "1"})
        if not allowed:
            return web.Response(status=401, text="Unauthorized\n",
                                headers={"WWW-Authenticate": f'Basic realm="{realm}"'})
        response = await handler(request)
        response.headers.update(config.headers)
        return response

    return authenticated


def make_app(holder: ExpositionHolder,
             web_config: WebConfig | LiveWebConfig | None = None,
             limits: ConnectionLimits | None = None) -> web.Application:
    """Build the aiohttp application (tests start it on a random port).

    With a LiveWebConfig, each request is checked against the config in force.
    ``limits`` bound the connections of the listeners ``start_server`` opens."""
    live = web_config if isinstance(web_config, LiveWebConfig) else None
    fixed = web_config if isinstance(web_config, WebConfig) else WebConfig()
    guard = ConnectionGuard(limits or ConnectionLimits())

    async def metrics(request: web.Request) -> web.Response:
        exposition = holder.current
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
        if holder.current is None:
            return web.Response(status=503, text="no sample taken yet\n")
        return web.Response(text="Ready\n")

    async def landing(request: web.Request) -> web.Response:
        return web.Response(text=LANDING_PAGE.format(version=__version__),
                            content_type="text/html")

    config_of = (lambda: live.current) if live is not None else (lambda: fixed)
    app = web.Application(middlewares=[guard_middleware(guard),
                                       auth_middleware(config_of, "slurm-gpu-exporter")])
    app[GUARD_KEY] = guard
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/-/healthy", healthy)
    app.router.add_get("/-/ready", ready)
    app.router.add_get("/", landing)
    return app


class _GuardedServer:
    """aiohttp's protocol factory, with each connection put under the guard."""

    def __init__(self, server: web.Server, guard: ConnectionGuard) -> None:
        self._server = server
        self._guard = guard
        self._factory = guard.wrap(server)

    def __call__(self) -> asyncio.Protocol:
        return self._factory()

    def __getattr__(self, name: str) -> object:
        return getattr(self._server, name)  # shutdown() and the rest, for the runner


class _GuardedRunner(web.AppRunner):
    """An AppRunner whose listeners' connections go through a ConnectionGuard."""

    def __init__(self, guard: ConnectionGuard, app: web.Application, **kwargs: object) -> None:
        super().__init__(app, **kwargs)  # type: ignore[arg-type]
        self._guard = guard

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        return _GuardedServer(server, self._guard)  # type: ignore[return-value]

    async def cleanup(self) -> None:
        self._guard.stop()
        await super().cleanup()


class ListenError(Exception):
    """An address could not be listened on; the message names it and why."""


def parse_listen_address(address: str) -> tuple[str | None, int]:
    """``:9817`` -> (None, 9817) (all addresses); ``127.0.0.1:9817``; ``[::1]:9817``."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"listen address {address!r} is not [host]:port")
    host = host.strip("[]")
    return (host or None), int(port)


async def start_server(app: web.Application, addresses: list[str],
                       web_config: WebConfig | LiveWebConfig | None) -> web.AppRunner:
    """Start listening on every address; returns the runner to clean up.

    Raises ListenError naming the first address that cannot be used."""
    guard = app[GUARD_KEY]
    runner = _GuardedRunner(guard, app, access_log=None, handle_signals=False,
                            keepalive_timeout=guard.limits.keepalive_timeout)
    await runner.setup()
    if isinstance(web_config, LiveWebConfig):
        ssl_context = web_config.server_ssl_context()
    else:
        ssl_context = web_config.ssl_context() if web_config else None
    for address in addresses:
        host, port = parse_listen_address(address)
        # The backlog is also how many connections asyncio accepts at once, before the
        # guard sees any: connections.ACCEPT_BATCH files are kept free for that.
        site = web.TCPSite(runner, host, port, ssl_context=ssl_context, reuse_address=True,
                           backlog=ACCEPT_BATCH)
        try:
            await site.start()
        except OSError as exc:
            await runner.cleanup()
            reason = os.strerror(exc.errno) if exc.errno else str(exc)
            raise ListenError(f"cannot listen on {address}: {reason}") from None
        scheme = "https" if ssl_context else "http"
        log.info("listening on %s://%s:%d/metrics", scheme, host or "0.0.0.0", port)
    return runner
