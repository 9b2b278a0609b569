"""Listening sockets with a connection cap, for the proxy's aiohttp application.

aiohttp's own sites take every connection the kernel hands them; a client that opens
connections and sends nothing would hold file descriptors until the process runs
out. The connections go through the web layer's ConnectionGuard (web/connections.py):
past half of ``max_connections`` a new connection closes the one idle the longest, so
idle sockets held open cannot keep out a caller who connects and asks; only when every
connection is in a request is a new one closed at once (and counted). Connections
that never send a byte close after the guard's header timeout, kept-alive ones after
its keepalive timeout; request bodies must arrive within the app's read timeout.
"""

from __future__ import annotations

import asyncio
import os
import ssl
from collections.abc import Callable

from aiohttp import web

from slurm_gpu_exporter.web.connections import ConnectionGuard, ConnectionLimits

# Below the unit's LimitNOFILE (4096), with room for the upstream pool and files.
DEFAULT_MAX_CONNECTIONS = 1024


class ListenError(Exception):
    """An address could not be listened on; the message names it and why."""


class CountingGuard(ConnectionGuard):
    """The guard, telling the proxy's metrics of each connection it refused or closed
    to make room."""

    def __init__(self, limits: ConnectionLimits, on_refused: Callable[[], None] = lambda: None,
                 on_evicted: Callable[[], None] = lambda: None) -> None:
        super().__init__(limits)
        self.on_refused, self.on_evicted = on_refused, on_evicted

    def _note(self, why: str) -> None:
        super()._note(why)
        if why.startswith("refused"):
            self.on_refused()
        elif why == "closed for a new one":
            self.on_evicted()


def parse_listen_address(address: str) -> tuple[str | None, int]:
    """``:9818`` -> (None, 9818) (all addresses); ``127.0.0.1:9818``; ``[::1]:9818``."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"listen address {address!r} is not [host]:port")
    return (host.strip("[]") or None), int(port)


async def listen(runner: web.AppRunner, addresses: list[str],
                 ssl_context: ssl.SSLContext | None, guard: ConnectionGuard
                 ) -> list[asyncio.Server]:
    """Serve ``runner``'s application on every address, its connections under
    ``guard`` (whose ``request`` the app's middleware must call: app.make_app); the
    caller closes the servers and stops the guard (before ``runner.cleanup()``).
    Raises ListenError naming the first bad address."""
    server = runner.server
    assert server is not None, "runner.setup() first"
    connection = guard.wrap(server)

    loop = asyncio.get_running_loop()
    started: list[asyncio.Server] = []
    for address in addresses:
        host, port = parse_listen_address(address)
        try:
            started.append(await loop.create_server(connection, host, port, ssl=ssl_context,
                                                    reuse_address=True, backlog=512))
        except OSError as exc:
            for s in started:
                s.close()
            reason = os.strerror(exc.errno) if exc.errno else str(exc)
            raise ListenError(f"cannot listen on {address}: {reason}") from None
    return started
