"""The proxy's requests to its store: users' and admins' over separate connection pools,
each user's share of them bounded, every answer's size capped.

A store can hold a query up to its own timeout (minutes): a user who sends many slow
ones would otherwise take every pooled connection and make everyone wait, admins
included. Each user gets ``upstream_per_user`` requests in flight (fairness.PerUser);
admins (and the readiness probe) have connections of their own. An answer is read up
to ``upstream_body_bytes`` and refused past it, so no answer can fill the proxy's memory.
"""

from __future__ import annotations

import logging
import time
from contextlib import AbstractAsyncContextManager, nullcontext

import aiohttp
from aiohttp import web
from yarl import URL

from slurm_gpu_exporter.proxy.fairness import FairLimits, PerUser
from slurm_gpu_exporter.proxy.observe import ProxyMetrics

log = logging.getLogger(__name__)
CHUNK_BYTES = 256 * 1024


class Upstream:
    """``call``: a store's answer as the proxy's response (502 when it fails or is too
    large); raises fairness.Busy when the user's share is taken. ``start``/``close``
    in the app's cleanup context."""

    def __init__(self, url: str, timeout: float, limits: FairLimits,
                 metrics: ProxyMetrics) -> None:
        self.url, self.timeout, self.limits, self.metrics = url, timeout, limits, metrics
        self.share = PerUser("queries at the store", limits.upstream_per_user,
                             limits.waiting_per_user, limits.wait_seconds)
        self.users: aiohttp.ClientSession | None = None
        self.admins: aiohttp.ClientSession | None = None

    def _session(self, connections: int) -> aiohttp.ClientSession:
        return aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=connections),
            timeout=aiohttp.ClientTimeout(total=self.timeout), auto_decompress=True)

    async def start(self) -> None:
        self.users = self._session(self.limits.user_upstream_connections)
        self.admins = self._session(self.limits.admin_upstream_connections)

    async def close(self) -> None:
        for session in (self.users, self.admins):
            if session is not None:
                await session.close()

    async def call(self, endpoint: str, method: str, url: URL, caller: str, admin: bool,
                   **kwargs: object) -> web.Response:
        session = self.admins if admin else self.users
        assert session is not None, "start() first"
        slot: AbstractAsyncContextManager[None] = (
            nullcontext() if admin else self.share.slot(caller))
        async with slot:
            return await self._ask(session, endpoint, method, url, **kwargs)

    async def _read_capped(self, resp: aiohttp.ClientResponse) -> bytes | None:
        """The body, or None past the cap (read no further)."""
        cap = self.limits.upstream_body_bytes
        if resp.content_length is not None and resp.content_length > cap:
            return None
        body = bytearray()
        async for chunk in resp.content.iter_chunked(CHUNK_BYTES):
            body += chunk
            if len(body) > cap:
                return None
        return bytes(body)

    async def _ask(self, session: aiohttp.ClientSession, endpoint: str, method: str,
                   url: URL, **kwargs: object) -> web.Response:
        metrics = self.metrics
        started = time.perf_counter()
        try:
            async with session.request(method, url, **kwargs) as resp:
                body = await self._read_capped(resp)
                status, content_type = resp.status, resp.content_type
        except (TimeoutError, aiohttp.ClientError) as exc:
            metrics.upstream_errors.labels(endpoint).inc()
            metrics.requests.labels(endpoint, "502").inc()
            log.warning("upstream %s did not answer %s: %s", self.url, endpoint,
                        exc or type(exc).__name__)
            return web.json_response(
                {"status": "error", "errorType": "unavailable",
                 "error": f"the Prometheus behind this proxy did not answer "
                          f"({type(exc).__name__}); try again, or tell its admins"},
                status=502)
        if body is None:
            metrics.upstream_errors.labels(endpoint).inc()
            metrics.requests.labels(endpoint, "502").inc()
            cap = self.limits.upstream_body_bytes
            log.warning("upstream answer to %s larger than %d bytes: refused", endpoint, cap)
            return web.json_response(
                {"status": "error", "errorType": "too_large",
                 "error": f"the store's answer is larger than this proxy's limit of {cap} "
                          "bytes (--limits.upstream-body-bytes); ask for less: a shorter "
                          "range, a larger step, fewer series"}, status=502)
        metrics.upstream_seconds.labels(endpoint).observe(time.perf_counter() - started)
        metrics.requests.labels(endpoint, str(status)).inc()
        return web.Response(status=status, body=body, content_type=content_type)
