"""Listening sockets with a connection cap, for the proxy's aiohttp application.

aiohttp's own sites take every connection the kernel hands them; a client that opens
connections and sends nothing would hold file descriptors until the process runs
out. Past ``max_connections`` open connections a new one is closed at once (and
counted); idle kept-alive connections close after the runner's keepalive timeout,
and request bodies must arrive within the app's read timeout.
"""

from __future__ import annotations

import asyncio
import os
import ssl
from collections.abc import Callable

from aiohttp import web

# Below the unit's LimitNOFILE (4096), with room for the upstream pool and files.
DEFAULT_MAX_CONNECTIONS = 1024


class ListenError(Exception):
    """An address could not be listened on; the message names it and why."""


class _Refused(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.close()


def parse_listen_address(address: str) -> tuple[str | None, int]:
    """``:9818`` -> (None, 9818) (all addresses); ``127.0.0.1:9818``; ``[::1]:9818``."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"listen address {address!r} is not [host]:port")
    return (host.strip("[]") or None), int(port)


async def listen(runner: web.AppRunner, addresses: list[str],
                 ssl_context: ssl.SSLContext | None,
                 on_refused: Callable[[], None] = lambda: None,
                 max_connections: int = DEFAULT_MAX_CONNECTIONS) -> list[asyncio.Server]:
    """Serve ``runner``'s application on every address; the caller closes the servers
    (before ``runner.cleanup()``). Raises ListenError naming the first bad address."""
    server = runner.server
    assert server is not None, "runner.setup() first"

    def connection() -> asyncio.Protocol:
        if len(server.connections) >= max_connections:
            on_refused()
            return _Refused()
        return server()

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
