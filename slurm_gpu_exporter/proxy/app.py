"""The proxy's HTTP side: authenticate, restrict, forward, answer.

The read endpoints of the Prometheus HTTP API that Grafana and slurm-gpu-report use
are open to every authenticated caller, with their queries and ``match[]`` selectors
restricted (enforce.py). Everything else is forwarded for admins only. What goes
upstream is built by the proxy: a fixed path and a fresh form of checked parameters,
never the client's own path, query string or headers.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlencode

import aiohttp
from aiohttp import web
from yarl import URL

from slurm_gpu_exporter.proxy import archive as job_archive
from slurm_gpu_exporter.proxy.archive import ArchiveReader, ArchiveUnavailable
from slurm_gpu_exporter.proxy.check_pool import CheckBusy, CheckPool
from slurm_gpu_exporter.proxy.config import ProxyConfig
from slurm_gpu_exporter.proxy.enforce import QueryRefused, Scope, default_series_selectors
from slurm_gpu_exporter.proxy.fairness import BackingOff, Backoff, Busy, FairLimits, PerUser
from slurm_gpu_exporter.proxy.identity import Caller, Refusal, identify
from slurm_gpu_exporter.proxy.limits import (
    LimitExceeded,
    check_query_text,
    check_regex_repetition,
)
from slurm_gpu_exporter.proxy.munge import MungeDecoder
from slurm_gpu_exporter.proxy.observe import ProxyMetrics
from slurm_gpu_exporter.proxy.params import FORM, BadRequest, pick, read_params, single
from slurm_gpu_exporter.proxy.printer import LABEL_NAME
from slurm_gpu_exporter.proxy.upstream import Upstream
from slurm_gpu_exporter.web.config import WebConfig
from slurm_gpu_exporter.web.connections import ConnectionGuard

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 1024 * 1024
REQUEST_READ_TIMEOUT_S = 30.0
# Upstream requests go as GET (one write on the socket, where a POST takes two) while
# the URL stays short enough for any proxy on the way; longer ones as a POST form.
UPSTREAM_GET_BYTES = 4096
OPEN_PATHS = {"/-/healthy", "/-/ready"}
OPEN_METHODS = ("GET", "HEAD")  # what the open paths take without authentication
# Keys of what the authentication middleware leaves on a request (typed keys where
# aiohttp has them, 3.13 on).
_RequestKey = getattr(web, "RequestKey", None)
CALLER: Any = _RequestKey("caller", Caller) if _RequestKey else "slurm_gpu_proxy.caller"
SCOPE: Any = _RequestKey("scope", Scope) if _RequestKey else "slurm_gpu_proxy.scope"


@dataclass(frozen=True)
class Endpoint:
    """A read endpoint: which parameters it takes and how they are restricted."""

    name: str
    query: str | None = None  # the parameter holding PromQL
    query_required: bool = False
    matches: bool = False  # takes match[] series selectors
    matches_required: bool = False
    others: tuple[str, ...] = ()
    post: bool = True  # the store takes a POST form too (else GET only)


ENDPOINTS = {
    "/api/v1/query": Endpoint("query", "query", True,
                              others=("time", "timeout", "limit", "lookback_delta")),
    "/api/v1/query_range": Endpoint("query_range", "query", True,
                                    others=("start", "end", "step", "timeout", "limit",
                                            "lookback_delta")),
    # Exemplars of the series the (restricted) query selects: Grafana asks for them.
    "/api/v1/query_exemplars": Endpoint("query_exemplars", "query", True,
                                        others=("start", "end")),
    "/api/v1/series": Endpoint("series", matches=True, matches_required=True,
                               others=("start", "end", "limit")),
    "/api/v1/labels": Endpoint("labels", matches=True, others=("start", "end", "limit")),
    "/api/v1/metadata": Endpoint("metadata", others=("metric", "limit", "limit_per_metric"),
                                 post=False),
    "/api/v1/status/buildinfo": Endpoint("buildinfo", post=False),
}
LABEL_VALUES = Endpoint("label_values", matches=True, others=("start", "end", "limit"),
                        post=False)


# What a 503 (too busy: password checks or query checks) tells the client to wait.
RETRY_AFTER_S = 1
# Admins are few, and their queries (Grafana's admin views, enforce, the reports)
# must not wait behind users' slow ones: one worker of their own.
ADMIN_CHECK_WORKERS = 1


class Refused(Exception):
    def __init__(self, status: int, reason: str, message: str,
                 retry_after: int = RETRY_AFTER_S) -> None:
        super().__init__(message)
        self.status, self.reason, self.message = status, reason, message
        self.retry_after = retry_after


def make_app(config: ProxyConfig, web_config: WebConfig | None = None,
             metrics: ProxyMetrics | None = None,
             read_timeout: float = REQUEST_READ_TIMEOUT_S,
             checks: CheckPool | None = None,
             admin_checks: CheckPool | None = None,
             munge: MungeDecoder | None = None,
             archive: ArchiveReader | None = None,
             limits: FairLimits | None = None,
             guard: ConnectionGuard | None = None) -> web.Application:
    """The proxy application (tests start it on a random port). A request body must
    arrive within ``read_timeout`` seconds. Queries are checked in the worker processes
    of ``checks``, admins' in those of ``admin_checks``, so that no flood of slow
    queries from users makes an admin wait (both started and stopped with the app);
    ``munge`` decodes munge credentials; ``archive`` answers archived jobs
    (archive.py). ``limits`` bound each user's share of the checkers and the store
    (fairness.py); ``guard`` is the listener's connection guard (listener.py), told
    which connections are in a request."""
    web_config = web_config or WebConfig()
    metrics = metrics or ProxyMetrics()
    upstream = URL(config.prometheus_url)
    checks = checks or CheckPool()
    admin_checks = admin_checks or CheckPool(workers=ADMIN_CHECK_WORKERS)
    limits = limits or FairLimits()
    # Each user's share: checks and upstream requests in flight, and a growing wait
    # for one whose queries keep being killed for time (fairness.py).
    check_share = PerUser("queries being checked", limits.checks_per_user,
                          limits.waiting_per_user, limits.wait_seconds)
    backoff = Backoff(limits.backoff_first_seconds, limits.backoff_max_seconds,
                      limits.backoff_forget_seconds)
    upstream_calls = Upstream(config.prometheus_url, config.upstream_timeout, limits,
                              metrics)

    async def session_context(app: web.Application):  # type: ignore[no-untyped-def]
        await checks.start()
        await admin_checks.start()
        await upstream_calls.start()
        yield
        await upstream_calls.close()
        await checks.close()
        await admin_checks.close()

    def refuse(request: web.Request, status: int, reason: str, message: str,
               user: str, endpoint: str, retry_after: int = RETRY_AFTER_S) -> web.Response:
        metrics.refusals.labels(reason).inc()
        metrics.requests.labels(endpoint, str(status)).inc()
        log.warning("refused %s %r for user %r: %s (%s)", request.method, request.path,
                    user or "-", reason, message)
        headers = {"WWW-Authenticate": 'Basic realm="slurm-gpu-proxy"'} if status == 401 else {}
        if status in (429, 503):
            headers["Retry-After"] = str(retry_after)
        return web.json_response({"status": "error", "errorType": reason, "error": message},
                                 status=status, headers=headers)

    @web.middleware
    async def authenticate(request: web.Request,
                           handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                           ) -> web.StreamResponse:
        if not request.raw_path.startswith("/"):
            # Absolute-form ("GET http://host/path"), authority- or asterisk-form: the
            # proxy forwards to its own store only, so it takes nothing but a path.
            return refuse(request, 400, "request_target", "the request target must be a "
                          "path such as /api/v1/query (origin-form), not a full URL or "
                          "'*'; this proxy forwards only to its own store", "", "other")
        if request.path in OPEN_PATHS:
            # Open for probes to read; anything else there is no request for the API.
            if request.method not in OPEN_METHODS:
                refused = refuse(request, 405, "method", f"{request.path} takes "
                                 f"{' or '.join(OPEN_METHODS)} only", "", "other")
                refused.headers["Allow"] = ", ".join(OPEN_METHODS)
                return refused
            response = await handler(request)
        else:
            who = await identify(request, web_config, config.user_header, munge)
            if isinstance(who, Refusal):
                return refuse(request, who.status, who.reason, who.message, who.claimed,
                              "auth")
            request[CALLER] = who
            request[SCOPE] = config.scope_for(who.name)
            try:
                response = await handler(request)
            except Refused as exc:
                return refuse(request, exc.status, exc.reason, exc.message, who.name,
                              _endpoint_name(request.path), exc.retry_after)
        response.headers.update(web_config.headers)
        return response

    async def call_upstream(endpoint: str, method: str, url: URL, caller: str,
                            admin: bool, **kwargs: object) -> web.Response:
        try:
            return await upstream_calls.call(endpoint, method, url, caller, admin, **kwargs)
        except Busy as exc:
            raise Refused(503, "busy", f"{exc}; retry in {exc.retry_after} s",
                          exc.retry_after) from None

    async def restricted(kind: str, text: str, scope: Scope, caller: str) -> str:
        try:
            # At once: what is past the limits never waits.
            check_query_text(text)
            check_regex_repetition(text)
            if scope.admin:
                return await admin_checks.check(kind, text, scope)
            backoff.check(caller)
            async with check_share.slot(caller):
                backoff.check(caller)  # struck while this one waited
                try:
                    return await checks.check(kind, text, scope)
                except QueryRefused as exc:
                    if exc.reason == "slow_query":
                        wait = backoff.strike(caller)
                        raise QueryRefused(f"{exc}; your next query is checked in "
                                           f"{wait:g} s at the earliest", exc.reason
                                           ) from None
                    raise
        except LimitExceeded as exc:
            raise Refused(400, "limit", str(exc)) from None
        except QueryRefused as exc:
            raise Refused(400, exc.reason, str(exc)) from None
        except BackingOff as exc:
            raise Refused(429, "backoff", str(exc), exc.retry_after) from None
        except Busy as exc:
            raise Refused(503, "busy", f"{exc}; retry in {exc.retry_after} s",
                          exc.retry_after) from None
        except CheckBusy as exc:
            raise Refused(503, "busy", f"the proxy is checking too many queries ({exc}); "
                          f"retry in {RETRY_AFTER_S} s") from None

    async def read_endpoint(request: web.Request, path: str, endpoint: Endpoint
                            ) -> web.Response:
        scope: Scope = request[SCOPE]
        caller: str = request[CALLER].name
        try:
            try:
                async with asyncio.timeout(read_timeout):
                    params = await read_params(request)
            except TimeoutError:
                raise Refused(408, "slow_request", f"the request body did not arrive within "
                              f"{read_timeout:g} s; send it at once") from None
            form = pick(params, endpoint.others)
            if endpoint.query is not None:
                query = single(params, endpoint.query, endpoint.query_required)
                if query is not None:
                    form.append((endpoint.query, await restricted("query", query, scope,
                                                                     caller)))
            if endpoint.matches:
                selectors = params.getall("match[]", [])
                if endpoint.matches_required and not selectors:
                    raise BadRequest("at least one match[] series selector is needed")
                for selector in selectors:
                    form.append(("match[]", await restricted("selector", selector,
                                                             scope, caller)))
                if not selectors and not scope.admin:
                    # Without match[], label names and values would come from every series.
                    form += [("match[]", s) for s in default_series_selectors(scope)]
        except BadRequest as exc:
            raise Refused(400, "bad_request", str(exc)) from None
        url = upstream.with_path(upstream.path.rstrip("/") + path, encoded=False)
        encoded = urlencode(form, quote_via=quote)
        if endpoint.post and len(encoded) > UPSTREAM_GET_BYTES:
            return await call_upstream(endpoint.name, "POST", url, caller, scope.admin,
                                       data=encoded, headers={"Content-Type": FORM})
        return await call_upstream(endpoint.name, "GET", URL(f"{url}?{encoded}", encoded=True),
                                   caller, scope.admin)

    async def api(request: web.Request) -> web.StreamResponse:
        path = request.path
        endpoint = ENDPOINTS.get(path)
        if endpoint is not None and request.method in ("GET", "POST"):
            if request.method == "POST" and not endpoint.post:
                raise Refused(405, "method", f"{path} takes GET only")
            return await read_endpoint(request, path, endpoint)
        label = _label_values_name(path)
        if label is not None and request.method == "GET":
            return await read_endpoint(request, f"/api/v1/label/{label}/values", LABEL_VALUES)
        if request[SCOPE].admin:
            return await passthrough(request)
        raise Refused(403, "endpoint", f"{request.method} {path} is for admins only; users "
                      "may query, query_range, series, labels, label values and metadata")

    async def passthrough(request: web.Request) -> web.Response:
        """An admin's request as it came (path, query string, body), to the same store."""
        body = await request.read()
        url = URL(str(upstream).rstrip("/") + request.raw_path, encoded=True)
        headers = {"Content-Type": request.headers["Content-Type"]} if (
            "Content-Type" in request.headers) else {}
        return await call_upstream("admin_passthrough", request.method, url,
                                   request[CALLER].name, True, data=body, headers=headers)

    async def archived_job(request: web.Request) -> web.Response:
        """``GET /slurm-gpu/v1/jobs/<jobid>[?cluster=NAME]``: the archived job, if the
        caller may see it (archive.py)."""
        if request.method != "GET":
            raise Refused(405, "method", f"{request.path} takes GET only")
        jobid = request.match_info["jobid"]
        if not job_archive.JOBID.fullmatch(jobid):
            raise Refused(400, "bad_jobid", "a job id is digits, with _TASK or +COMPONENT "
                          "at most (e.g. 12345, 12345_7)")
        if set(request.query) - {"cluster"} or len(request.query.getall("cluster", [])) > 1:
            raise Refused(400, "bad_request", "the only parameter is one cluster=NAME")
        cluster = request.query.get("cluster")
        if cluster is not None and not job_archive.CLUSTER.fullmatch(cluster):
            raise Refused(400, "bad_request", "cluster must be a cluster name (letters, "
                          "digits, ._-)")
        if archive is None:
            raise Refused(404, "no_archive", "this proxy serves no job archive; its admins "
                          "can start it with --archive.url")
        if archive.busy:
            raise Refused(503, "busy", f"the proxy is reading the archive for too many "
                          f"requests; retry in {RETRY_AFTER_S} s")
        started = time.perf_counter()
        try:
            found = await archive.job(jobid, cluster)
        except ArchiveUnavailable as exc:
            log.warning("archive read of job %s failed: %s", jobid, exc)
            metrics.upstream_errors.labels("archive_job").inc()
            raise Refused(503, "archive_unavailable", "the job archive behind this proxy "
                          "cannot be read now; try again, or tell its admins") from None
        metrics.upstream_seconds.labels("archive_job").observe(time.perf_counter() - started)
        body = job_archive.answer(found, request[SCOPE], jobid, Refused)
        metrics.requests.labels("archive_job", "200").inc()
        return web.json_response(body)

    async def not_found(request: web.Request) -> web.Response:
        raise Refused(404, "not_found", f"no such endpoint {request.path}; the archive's "
                      "is /slurm-gpu/v1/jobs/<jobid>")

    async def own_metrics(request: web.Request) -> web.Response:
        return web.Response(body=metrics.exposition(),
                            content_type="text/plain", charset="utf-8")

    async def healthy(request: web.Request) -> web.Response:
        return web.Response(text="Healthy\n")

    async def ready(request: web.Request) -> web.Response:
        url = upstream.with_path(upstream.path.rstrip("/") + "/api/v1/query")
        try:
            assert upstream_calls.admins is not None
            async with upstream_calls.admins.get(url, params={"query": "1"},
                                            timeout=aiohttp.ClientTimeout(total=5)) as resp:
                if resp.status == 200:
                    return web.Response(text="Ready\n")
                problem = f"HTTP {resp.status}"
        except (TimeoutError, aiohttp.ClientError) as exc:
            problem = type(exc).__name__
        return web.Response(status=503, text=f"upstream {config.prometheus_url} not "
                            f"reachable ({problem}); check --prometheus-url\n")

    @web.middleware
    async def in_request(request: web.Request,
                         handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                         ) -> web.StreamResponse:
        assert guard is not None
        with guard.request(request.transport):  # not closed for a new one meanwhile
            return await handler(request)

    # (not `if guard`: a guard with no connections is falsy, it has a length)
    middlewares = [in_request, authenticate] if guard is not None else [authenticate]
    app = web.Application(middlewares=middlewares, client_max_size=MAX_BODY_BYTES)
    app.cleanup_ctx.append(session_context)
    app.router.add_get("/-/healthy", healthy)
    app.router.add_get("/-/ready", ready)
    app.router.add_get("/metrics", own_metrics)
    app.router.add_route("*", job_archive.ROUTE, archived_job)
    app.router.add_route("*", "/slurm-gpu/{tail:.*}", not_found)
    app.router.add_route("*", "/{tail:.*}", api)
    return app


def _label_values_name(path: str) -> str | None:
    """``name`` of ``/api/v1/label/<name>/values`` when it is a valid label name."""
    prefix, suffix = "/api/v1/label/", "/values"
    if not (path.startswith(prefix) and path.endswith(suffix)):
        return None
    name = path[len(prefix):-len(suffix)]
    return name if LABEL_NAME.fullmatch(name) else None


def _endpoint_name(path: str) -> str:
    if path.startswith("/slurm-gpu/"):
        return "archive_job"
    if path in ENDPOINTS:
        return ENDPOINTS[path].name
    return "label_values" if _label_values_name(path) else "other"

