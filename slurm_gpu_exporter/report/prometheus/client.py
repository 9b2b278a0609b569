"""A small client for the Prometheus HTTP API (Prometheus, Thanos, VictoriaMetrics).

Instant and range queries over aiohttp, with basic auth, a bearer token and TLS
options, a timeout per query, and a count of the queries made (the report's cost
does not grow with the number of jobs, and this count shows it). Every failure
becomes a ReportError with one line that says what to do.
"""

from __future__ import annotations

import asyncio
import base64
import math
import ssl
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import aiohttp

from slurm_gpu_exporter.report.errors import ReportError

T = TypeVar("T")

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


def _ssl_context(conn: Connection) -> ssl.SSLContext | bool:
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

    def __init__(self, conn: Connection, on_query: Callable[[str], None] | None = None) -> None:
        if not conn.url.startswith(("http://", "https://")):
            raise ReportError(f"bad --prometheus-url {conn.url!r}: it must start with "
                              "http:// or https://")
        self.conn = conn
        self.queries = 0
        self._on_query = on_query
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> PrometheusClient:
        headers = {}
        if self.conn.bearer_token:
            headers["Authorization"] = f"Bearer {self.conn.bearer_token}"
        if self.conn.username is not None:
            pair = f"{self.conn.username}:{self.conn.password or ''}".encode()
            headers["Authorization"] = "Basic " + base64.b64encode(pair).decode()
        self._session = aiohttp.ClientSession(
            headers=headers,
            timeout=aiohttp.ClientTimeout(total=self.conn.timeout_s),
            connector=aiohttp.TCPConnector(ssl=_ssl_context(self.conn)),
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
        headers = {}
        if self.conn.munge_credential is not None:
            credential = await asyncio.to_thread(self.conn.munge_credential)
            headers["Authorization"] = f"Munge {credential}"
        try:
            async with self._session.post(url, data=params, headers=headers) as resp:
                try:
                    body = await resp.json(content_type=None)
                except ValueError:
                    body = None
                status = resp.status
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
        return _check(body, status, self.conn.url)


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
