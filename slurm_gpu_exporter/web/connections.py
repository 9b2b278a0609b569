"""A cap and idle timeouts for the listener's connections, below the HTTP layer.

Connections that send nothing (or drip a header byte by byte) would otherwise stay
open for ever, use up the agent's file limit and make its own cgroup, spool and
state reads fail. So each connection is idle (no request in progress) for at most
``header_timeout`` seconds before its first request and ``keepalive_timeout`` after
a response, a request may take ``request_timeout``, and there are never more than
``max_connections``. Past half of that, a new connection closes the connection idle
the longest (those that never sent a byte first); only when every one is in a
request is the new one refused. A scraper that
connects and asks at once is therefore always served, however many idle
connections an attacker opens. With ``max_per_client``, one client address holds at
most that many: its new connection past it closes its own longest-idle one, or is
refused when all of its are in a request, so one client's busy connections cannot
fill the cap either.

Works with any asyncio protocol factory (aiohttp's ``web.Server``); the HTTP layer
tells it when a request starts and ends (``ConnectionGuard.request``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import resource
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

log = logging.getLogger(__name__)

# Files the agent needs besides its connections: cgroup, /proc and spool reads, the
# state file, NVML's device nodes, the relay's socket and its senders.
RESERVED_FILES = 256
# asyncio accepts up to the listen backlog in one go before any protocol runs: that
# many files more may be open for a moment.
ACCEPT_BATCH = 128
# Seconds a new connection is spared when others are closed to make room (see admit).
YOUNG_S = 0.1


@dataclass(frozen=True)
class ConnectionLimits:
    """How many connections, and how long each may idle (seconds)."""

    max_connections: int = 256
    header_timeout: float = 10.0
    keepalive_timeout: float = 15.0
    request_timeout: float = 60.0
    max_per_client: int = 0  # connections from one address (0: no cap of its own)


def connection_cap(wanted: int, reserved: int = RESERVED_FILES) -> int:
    """``wanted`` connections, or fewer where the file limit leaves no room for them
    besides ``reserved`` files of the agent's own and one accept batch (at least 8)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return wanted
    return max(8, min(wanted, soft - reserved - ACCEPT_BATCH))


# The most cgroup files the sampler keeps open (HeldFiles): six or so per job.
MAX_HELD_FILES = 4096


def held_files_budget(connections: int, reserved: int = RESERVED_FILES) -> int:
    """How many files the sampler may keep open between samples: half of what the file
    limit leaves besides ``connections``, one accept batch and ``reserved`` files of the
    agent's own, at most MAX_HELD_FILES (``LimitNOFILE=8192`` and 256 connections: 3,776,
    enough for some 500 jobs on cgroup v1)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return MAX_HELD_FILES
    return max(0, min(MAX_HELD_FILES, (soft - reserved - ACCEPT_BATCH - connections) // 2))


class _Connection(asyncio.Protocol):
    """One connection under the guard. The HTTP protocol behind it is made at its
    first byte: a connection that never speaks costs no more than this object."""

    def __init__(self, guard: ConnectionGuard, factory: Callable[[], asyncio.Protocol]
                 ) -> None:
        self.guard = guard
        self.factory = factory
        self.inner: asyncio.Protocol | None = None
        self.transport: asyncio.BaseTransport | None = None
        self.admitted = False
        self.spoke = False  # has sent a byte
        self.used = False  # has had a request
        self.busy = 0  # requests in progress
        self.since = guard.clock()  # when it became idle or busy
        self.opened = self.since
        self.client: object = None  # the peer's address, without its port

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        peer = transport.get_extra_info("peername")
        self.client = peer[0] if isinstance(peer, tuple) and peer else peer
        self.admitted = self.guard.admit(self)
        if not self.admitted:
            transport.abort()

    def data_received(self, data: bytes) -> None:
        if not self.admitted:
            return
        if self.inner is None:
            self.spoke = True
            self.inner = self.factory()
            self.inner.connection_made(self.transport)  # type: ignore[arg-type]
        self.inner.data_received(data)  # type: ignore[attr-defined]

    def eof_received(self) -> bool | None:
        if self.inner is None:
            return None  # closes the connection
        return self.inner.eof_received()  # type: ignore[attr-defined]

    def connection_lost(self, exc: Exception | None) -> None:
        if self.admitted:
            self.guard.release(self)
        if self.inner is not None:
            self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        if self.inner is not None:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        if self.inner is not None:
            self.inner.resume_writing()


class ConnectionGuard:
    """Counts the listener's connections, closes idle ones, and caps them.

    Runs on the event loop only (not thread-safe); ``sweep`` runs every second while a
    connection is open or closes are left to log (an agent nobody scrapes does not
    wake for it). ``product`` is who serves (``slurm-gpu-proxy``…), named in the log
    line; ``on_refused`` is told of each connection refused, ``on_evicted`` of each
    idle one closed for a new one past half the cap (for the server's own counters).
    """

    def __init__(self, limits: ConnectionLimits, *, product: str,
                 clock: Callable[[], float] = time.monotonic,
                 on_refused: Callable[[], None] | None = None,
                 on_evicted: Callable[[], None] | None = None) -> None:
        self.limits = limits
        self.product = product
        self.clock = clock
        self._on_refused = on_refused
        self._on_evicted = on_evicted
        self._open: dict[asyncio.BaseTransport, _Connection] = {}
        self._closed: dict[str, int] = {}  # why -> connections closed since the last log
        self._logged_at = -float("inf")
        self._sweeper: asyncio.Task[None] | None = None
        self._work: asyncio.Event | None = None  # set when a connection is admitted

    def __len__(self) -> int:
        """Connections open now."""
        return len(self._open)

    def wrap(self, factory: Callable[[], asyncio.Protocol]) -> Callable[[], asyncio.Protocol]:
        """A protocol factory for ``loop.create_server`` that puts ``factory``'s
        protocols under this guard."""
        if self._sweeper is None:
            self._work = asyncio.Event()
            self._sweeper = asyncio.get_running_loop().create_task(self._sweep_forever())
        return lambda: _Connection(self, factory)

    def stop(self) -> None:
        """Stop sweeping (at shutdown)."""
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None

    @contextlib.contextmanager
    def request(self, transport: asyncio.BaseTransport | None) -> Iterator[None]:
        """Mark a request in progress on ``transport`` (the HTTP layer's middleware)."""
        conn = self._open.get(transport) if transport is not None else None
        if conn is None:
            yield
            return
        conn.busy += 1
        conn.used = True
        conn.since = self.clock()
        try:
            yield
        finally:
            conn.busy -= 1
            conn.since = self.clock()

    def admit(self, conn: _Connection) -> bool:
        """Take a new connection in, making room by closing idle ones when needed.

        Past half the cap, a new connection closes the one idle the longest among
        those older than YOUNG_S (silent ones first); at the cap, any idle one. A
        connection younger than that has often sent its request already, unread
        yet: one accept batch of a flood must not close a scraper's connection.
        """
        if self.limits.max_per_client and not self._room_for_client(conn):
            self._refuse("refused: every connection of the client is in a request")
            return False
        limit = self.limits.max_connections
        if len(self._open) >= limit // 2:
            now = self.clock()
            idle = [c for c in self._open.values() if not c.busy]
            old = [c for c in idle if now - c.opened > YOUNG_S]
            candidates = old or (idle if len(self._open) >= limit else [])
            if candidates:
                self._close(min(candidates, key=lambda c: (c.spoke, c.used, c.since)),
                            "closed for a new one")
                if self._on_evicted is not None:
                    self._on_evicted()
            elif len(self._open) >= limit:
                self._refuse("refused: every connection is in a request")
                return False
        assert conn.transport is not None
        self._open[conn.transport] = conn
        if self._work is not None:
            self._work.set()
        return True

    def _room_for_client(self, conn: _Connection) -> bool:
        """Below the client's own cap, or made so by closing its longest-idle
        connection (one older than YOUNG_S first); False when all of its are busy."""
        mine = [c for c in self._open.values() if c.client == conn.client]
        if len(mine) < self.limits.max_per_client:
            return True
        now = self.clock()
        idle = [c for c in mine if not c.busy]
        candidates = [c for c in idle if now - c.opened > YOUNG_S] or idle
        if not candidates:
            return False
        self._close(min(candidates, key=lambda c: (c.spoke, c.used, c.since)),
                    "closed for the same client's new one")
        return True

    def release(self, conn: _Connection) -> None:
        if conn.transport is not None:
            self._open.pop(conn.transport, None)

    def sweep(self) -> None:
        """Close the connections idle or busy past their timeout."""
        now = self.clock()
        limits = self.limits
        for conn in list(self._open.values()):
            if conn.busy:
                if now - conn.since > limits.request_timeout:
                    self._close(conn, "request took too long")
            elif now - conn.since > (limits.keepalive_timeout if conn.used
                                     else limits.header_timeout):
                self._close(conn, "idle")
        self._log_closed(now)

    def _close(self, conn: _Connection, why: str) -> None:
        self.release(conn)
        if conn.transport is not None:
            conn.transport.abort()
        self._note(why)

    def _refuse(self, why: str) -> None:
        self._note(why)
        if self._on_refused is not None:
            self._on_refused()

    def _note(self, why: str) -> None:
        self._closed[why] = self._closed.get(why, 0) + 1

    def _log_closed(self, now: float) -> None:
        # One line a minute at most, however many connections an attacker opens.
        if not self._closed or now - self._logged_at < 60.0:
            return
        self._logged_at = now
        counts = ", ".join(f"{n} {why}" for why, n in sorted(self._closed.items()))
        self._closed = {}
        log.warning("HTTP connections closed by %s in the last minute: %s (cap %d, "
                    "header timeout %g s); if these are real scrapers, raise "
                    "--web.max-connections", self.product, counts,
                    self.limits.max_connections, self.limits.header_timeout)

    async def _sweep_forever(self) -> None:
        assert self._work is not None
        while True:
            if not self._open and not self._closed:  # nothing to time out or to log
                self._work.clear()
                await self._work.wait()
            await asyncio.sleep(1.0)
            self.sweep()
