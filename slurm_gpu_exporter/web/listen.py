"""Listening: listen addresses, and starting an application on them with every
connection under the app's ConnectionGuard (connections.py).

Every server stands on this: the agent, ``slurm-gpu-report remediate`` and
``slurm-gpu-proxy``. The app carries its guard (``middleware.guarded_app``), whose
limits also set aiohttp's keep-alive timeout.
"""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
from collections.abc import Callable
from dataclasses import dataclass

from aiohttp import web

from slurm_gpu_exporter.web.config import WebConfig
from slurm_gpu_exporter.web.connections import ACCEPT_BATCH, ConnectionGuard
from slurm_gpu_exporter.web.middleware import GUARD_KEY
from slurm_gpu_exporter.web.reload import LiveWebConfig

log = logging.getLogger(__name__)


class ListenError(Exception):
    """An address could not be listened on; the message names it and why."""


def parse_listen_address(address: str) -> tuple[str | None, int]:
    """``:9817`` -> (None, 9817) (all addresses); ``127.0.0.1:9817``; ``[::1]:9817``."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"listen address {address!r} is not [host]:port")
    return (host.strip("[]") or None), int(port)


def ssl_context_of(web_config: WebConfig | LiveWebConfig | None) -> ssl.SSLContext | None:
    """The context to listen with: None for plain HTTP; a LiveWebConfig's follows its
    re-reads (reload.py)."""
    if isinstance(web_config, LiveWebConfig):
        return web_config.server_ssl_context()
    return web_config.ssl_context() if web_config else None


@dataclass(frozen=True)
class Bound:
    """One address listened on."""

    address: str  # as given (``:9817``)
    host: str | None
    port: int
    tls: bool

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.host or '0.0.0.0'}:{self.port}"


def announce_metrics(bound: Bound) -> None:
    """The agent's (and remediate's) line for each address: where ``/metrics`` is."""
    log.info("listening on %s/metrics", bound.url)


class _GuardedServer:
    """aiohttp's protocol factory, with each connection put under the guard."""

    def __init__(self, server: web.Server, guard: ConnectionGuard) -> None:
        self._server = server
        self._factory = guard.wrap(server)

    def __call__(self) -> asyncio.Protocol:
        return self._factory()

    def __getattr__(self, name: str) -> object:
        return getattr(self._server, name)  # shutdown() and the rest, for the runner


class _GuardedRunner(web.AppRunner):
    """An AppRunner whose listeners' connections go through a ConnectionGuard, which
    stops sweeping at clean-up."""

    def __init__(self, guard: ConnectionGuard, app: web.Application, **kwargs: object) -> None:
        super().__init__(app, **kwargs)  # type: ignore[arg-type]
        self._guard = guard

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        return _GuardedServer(server, self._guard)  # type: ignore[return-value]

    async def cleanup(self) -> None:
        self._guard.stop()
        await super().cleanup()


async def start(app: web.Application, addresses: list[str],
                ssl_context: ssl.SSLContext | None, *,
                backlog: int = ACCEPT_BATCH, lingering_time: float | None = None,
                announce: Callable[[Bound], None] = announce_metrics) -> web.AppRunner:
    """Set ``app`` up (its start-up hooks run here) and listen on every address, each
    connection under ``app[GUARD_KEY]``; ``announce`` is told of each address as it
    listens. Returns the runner, whose ``cleanup()`` stops it all.

    Raises ListenError naming the first address that cannot be used; an error of the
    app's own start-up hooks is raised as it is. Either way nothing is left running.
    """
    guard = app[GUARD_KEY]
    extra = {} if lingering_time is None else {"lingering_time": lingering_time}
    runner = _GuardedRunner(guard, app, access_log=None, handle_signals=False,
                            keepalive_timeout=guard.limits.keepalive_timeout, **extra)
    try:
        await runner.setup()
    except BaseException:
        await runner.cleanup()
        raise
    for address in addresses:
        host, port = parse_listen_address(address)
        # The backlog is also how many connections asyncio accepts at once, before the
        # guard sees any: connections.ACCEPT_BATCH files are kept free for that.
        site = web.TCPSite(runner, host, port, ssl_context=ssl_context, reuse_address=True,
                           backlog=backlog)
        try:
            await site.start()
        except OSError as exc:
            await runner.cleanup()
            reason = os.strerror(exc.errno) if exc.errno else str(exc)
            raise ListenError(f"cannot listen on {address}: {reason}") from None
        announce(Bound(address, host, port, ssl_context is not None))
    return runner
