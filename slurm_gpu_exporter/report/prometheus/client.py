"""The one client for the Prometheus HTTP API (Prometheus, Thanos, VictoriaMetrics, and
slurm-gpu-proxy in front of them): the reports', the archive's, enforce's, remediate's
and top's queries, and the proxy's job archive (``get``, archived.py).

Instant and range queries over aiohttp, with basic auth, a bearer token, a fresh munge
credential per request and TLS options, a timeout per query, and a count of the
queries made (the report's cost does not grow with the number of jobs, and this count
shows it). At most ``max_concurrent`` queries are in flight at once, however many the
caller gathers, and a busy answer (503, 429) is tried again as ``retry.py`` says.
Every failure of a query becomes a ReportError with one line that says what to do.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import ssl
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import aiohttp

from slurm_gpu_exporter.model.munge_wire import authorization
from slurm_gpu_exporter.report.basic_credentials import basic_authorization
from slurm_gpu_exporter.report.errors import ReportError
from slurm_gpu_exporter.report.prometheus.retry import (
    DEFAULT_MAX_CONCURRENT,
    RetryPolicy,
    is_busy,
)

T = TypeVar("T")
log = logging.getLogger(__name__)

EXIT_UNREACHABLE = 3
EXIT_QUERY = 4


@dataclass(frozen=True)
class Connection:
    """Where Prometheus is and how to talk to it."""

    url: str
    timeout_s: float = 30.0
    username: str | None = None
    password: str | None = None
    bearer_token: str | None = None
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    insecure_skip_verify: bool = False
    # A fresh munge credential for each request (--auth munge), made off the event loop.
    munge_credential: Callable[[], str] | None = None
    # Queries in flight at once: a store runs a few at a time and refuses the queue.
    max_concurrent: int = DEFAULT_MAX_CONCURRENT
    retry: RetryPolicy = field(default_factory=RetryPolicy)


@dataclass(frozen=True)
class Sample:
    """One element of an instant vector: its labels and value."""

    labels: dict[str, str]
    value: float


@dataclass(frozen=True)
class Series:
    """One element of a range result: labels and (time, value) points."""

    labels: dict[str, str]
    points: list[tuple[float, float]] = field(default_factory=list)


def ssl_context(conn: Connection) -> ssl.SSLContext | bool:
    if not conn.url.startswith("https:"):
        return True
    try:
        context = ssl.create_default_context(cafile=conn.ca_file)
        if conn.cert_file:
            context.load_cert_chain(conn.cert_file, conn.key_file)
    except (OSError, ssl.SSLError) as exc:
        raise ReportError(f"cannot load the TLS files: {exc}") from None
    if conn.insecure_skip_verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context


class PrometheusClient:
    """Queries one Prometheus; use as ``async with PrometheusClient(conn) as prom``."""

    def __init__(self, conn: Connection, on_query: Callable[[str], None] | None = None,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        if not conn.url.startswith(("http://", "https://")):
            raise ReportError(f"bad --prometheus-url {conn.url!r}: it must start with "
                              "http:// or https://")
        if conn.max_concurrent < 1:
            raise ReportError("--max-concurrent-queries must be 1 or more")
        self.conn = conn
        self.queries = 0
        self.busy_answers = 0  # answers 503/429 that were tried again
        self.in_flight = 0
        self.most_in_flight = 0
        self._on_query = on_query
        self._sleep = sleep
        self._slots = asyncio.Semaphore(conn.max_concurrent)
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> PrometheusClient:
        headers = {}
        if self.conn.bearer_token:
            headers["Authorization"] = f"Bearer {self.conn.bearer_token}"
        if self.conn.username is not None:
            headers["Authorization"] = basic_authorization(self.conn.username,
                                                           self.conn.password or "")
        self._session = aiohttp.ClientSession(
            headers=headers,
            timeout=aiohttp.ClientTimeout(total=self.conn.timeout_s),
            connector=aiohttp.TCPConnector(ssl=ssl_context(self.conn)),
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
            await self._session.close()

    async def instant(self, query: str, at: float) -> list[Sample]:
        """An instant query evaluated at ``at``."""
        data = await self._call("query", {"query": query, "time": _ts(at)})
        if data["resultType"] != "vector":
            raise ReportError(f"Prometheus answered a {data['resultType']} to an instant "
                              "query; is --prometheus-url a Prometheus API?", EXIT_QUERY)
        return [Sample(item["metric"], float(item["value"][1])) for item in data["result"]]

    async def range(self, query: str, start: float, end: float, step: float) -> list[Series]:
        """A range query from ``start`` to ``end`` every ``step`` seconds."""
        data = await self._call("query_range", {"query": query, "start": _ts(start),
                                                "end": _ts(end), "step": f"{step:g}"})
        return [Series(item["metric"],
                       [(float(t), float(v)) for t, v in item["values"]
                        if not math.isnan(float(v))])
                for item in data["result"]]

    async def _call(self, endpoint: str, params: dict[str, str]) -> dict:  # type: ignore[type-arg]
        assert self._session is not None, "use the client as an async context manager"
        self.queries += 1
        if self._on_query is not None:
            self._on_query(params["query"])
        url = f"{self.conn.url.rstrip('/')}/api/v1/{endpoint}"
        policy = self.conn.retry
        waited = 0.0
        for attempt in range(policy.retries + 1):
            async with self._slots:
                status, body, retry_after = await self._post(url, params)
            if not is_busy(status) or policy.retries == 0:
                return _check(body, status, self.conn.url)
            if attempt == policy.retries:
                break
            self.busy_answers += 1
            pause = policy.pause(attempt + 1, retry_after, time.time())
            log.debug("Prometheus answered HTTP %d (busy); query tried again in %.1f s",
                      status, pause)
            await self._sleep(pause)  # outside the slot: the others may go meanwhile
            waited += pause
        raise ReportError(f"Prometheus at {self.conn.url} was busy (HTTP {status}"
                          f"{': ' + _message(body) if _message(body) else ''}) at each of "
                          f"{policy.retries + 1} tries over {waited:.1f} s; try again later, "
                          "or lower --max-concurrent-queries", EXIT_QUERY)

    async def get(self, path: str, params: dict[str, str], max_bytes: int
                  ) -> tuple[int, bytes]:
        """One GET of ``path`` under the base URL, signed in as the queries are: its
        status and at most ``max_bytes`` of its body. Not a query: neither counted nor
        tried again; aiohttp's errors and TimeoutError are the caller's to word."""
        assert self._session is not None, "use the client as an async context manager"
        url = self.conn.url.rstrip("/") + path
        async with self._session.get(url, params=params,
                                     headers=await self._request_headers()) as resp:
            return resp.status, await resp.content.read(max_bytes)

    async def _request_headers(self) -> dict[str, str]:
        """What one request adds to the session's sign-in: a munge credential."""
        if self.conn.munge_credential is None:
            return {}
        # A fresh credential for every request: the proxy refuses one seen before.
        credential = await asyncio.to_thread(self.conn.munge_credential)
        return {"Authorization": authorization(credential)}

    async def _post(self, url: str, params: dict[str, str]
                    ) -> tuple[int, object, str | None]:
        """One request: its status, its body (JSON, else text) and its Retry-After."""
        assert self._session is not None
        headers = await self._request_headers()
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            async with self._session.post(url, data=params, headers=headers) as resp:
                text = await resp.text(errors="replace")
                body: object
                try:
                    body = json.loads(text)
                except ValueError:
                    body = text
                return resp.status, body, resp.headers.get("Retry-After")
        except TimeoutError:
            raise ReportError(f"Prometheus at {self.conn.url} did not answer within "
                              f"{self.conn.timeout_s:g} s; try a shorter window or a longer "
                              "--timeout", EXIT_UNREACHABLE) from None
        except aiohttp.ClientConnectorError as exc:
            raise ReportError(f"cannot reach Prometheus at {self.conn.url}: "
                              f"{exc.os_error.strerror or exc}; check --prometheus-url",
                              EXIT_UNREACHABLE) from None
        except aiohttp.ClientError as exc:
            raise ReportError(f"Prometheus at {self.conn.url} failed: {exc}",
                              EXIT_UNREACHABLE) from None
        finally:
            self.in_flight -= 1


def _message(body: object) -> str:
    """What a refusal says about itself, in one short line."""
    if isinstance(body, dict):
        text = str(body.get("error") or body.get("errorType") or "")
    else:
        text = str(body or "")
    lines = text.strip().splitlines()
    return lines[0][:200] if lines else ""


def _check(body: object, status: int, url: str) -> dict:  # type: ignore[type-arg]
    if not isinstance(body, dict) or "status" not in body:
        hint = {401: "check the credentials", 403: "check the credentials",
                503: "the server is busy or down; try again",
                404: "is --prometheus-url the server's base URL?"}.get(status, "")
        raise ReportError(f"Prometheus at {url} answered HTTP {status} without an API "
                          f"response{'; ' + hint if hint else ''}", EXIT_QUERY)
    if body["status"] != "success":
        raise ReportError(f"Prometheus at {url} answered HTTP {status}: "
                          f"{body.get('errorType', 'error')}: {body.get('error', '?')}",
                          EXIT_QUERY)
    if body.get("warnings"):
        # Thanos and others answer with some stores missing: the totals would be wrong.
        raise ReportError(f"Prometheus at {url} answered with partial data "
                          f"({body['warnings'][0]}); try again when all stores answer",
                          EXIT_QUERY)
    return body["data"]  # type: ignore[no-any-return]


def _ts(t: float) -> str:
    return f"{t:.3f}"


async def gather(*coros: Coroutine[Any, Any, T]) -> list[T]:
    """Run queries concurrently; the first failure cancels the rest and is raised alone."""
    try:
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(coro) for coro in coros]
    except ExceptionGroup as failed:
        first = failed.exceptions[0]
        raise first from None
    return [task.result() for task in tasks]


def read_secret(path: str | None) -> str | None:
    """A password or token from a file (first line), so it stays off the command line."""
    if path is None:
        return None
    try:
        return Path(path).read_text().splitlines()[0].strip()
    except (OSError, IndexError) as exc:
        raise ReportError(f"cannot read the secret file {path}: "
                          f"{getattr(exc, 'strerror', None) or 'empty file'}") from None
