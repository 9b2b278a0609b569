"""The proxy's HTTP application: authenticate, then the Prometheus API (api.py), the
job archive's endpoint, and the proxy's own metrics and health.

``make_app`` only builds the state (state.py) and wires routes and middlewares; the
handlers are module-level functions over ``request.app[STATE]``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator

import aiohttp
from aiohttp import web

from slurm_gpu_exporter.proxy import archive as job_archive
from slurm_gpu_exporter.proxy.api import api, endpoint_name
from slurm_gpu_exporter.proxy.archive import ArchiveReader, ArchiveUnavailable
from slurm_gpu_exporter.proxy.config import ProxyConfig
from slurm_gpu_exporter.proxy.fairness import Backoff, FairLimits, PerUser
from slurm_gpu_exporter.proxy.identity import Refusal, identify
from slurm_gpu_exporter.proxy.munge import MungeDecoder
from slurm_gpu_exporter.proxy.observe import ProxyMetrics
from slurm_gpu_exporter.proxy.query.check_pool import CheckPool
from slurm_gpu_exporter.proxy.state import (
    CALLER,
    RETRY_AFTER_S,
    SCOPE,
    STATE,
    ProxyState,
    Refused,
)
from slurm_gpu_exporter.proxy.upstream import Upstream
from slurm_gpu_exporter.web.config import WebConfig
from slurm_gpu_exporter.web.connections import ConnectionGuard, ConnectionLimits
from slurm_gpu_exporter.web.middleware import Handler, guarded_app

log = logging.getLogger(__name__)

PRODUCT = "slurm-gpu-proxy"
MAX_BODY_BYTES = 1024 * 1024
REQUEST_READ_TIMEOUT_S = 30.0
OPEN_PATHS = {"/-/healthy", "/-/ready"}
OPEN_METHODS = ("GET", "HEAD")  # what the open paths take without authentication
# Admins are few, and their queries (Grafana's admin views, enforce, the reports)
# must not wait behind users' slow ones: one worker of their own.
ADMIN_CHECK_WORKERS = 1


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
    (fairness.py); ``guard`` is the listeners' connection guard (web/listen.py), told
    which connections are in a request."""
    metrics = metrics or ProxyMetrics()
    limits = limits or FairLimits()
    state = ProxyState(
        config=config, web_config=web_config or WebConfig(), metrics=metrics,
        checks=checks or CheckPool(),
        admin_checks=admin_checks or CheckPool(workers=ADMIN_CHECK_WORKERS),
        # Each user's share: checks and upstream requests in flight, and a growing wait
        # for one whose queries keep being killed for time (fairness.py).
        check_share=PerUser("queries being checked", limits.checks_per_user,
                            limits.waiting_per_user, limits.wait_seconds),
        backoff=Backoff(limits.backoff_first_seconds, limits.backoff_max_seconds,
                        limits.backoff_forget_seconds),
        upstream_calls=Upstream(config.prometheus_url, config.upstream_timeout, limits,
                                metrics),
        read_timeout=read_timeout, munge=munge, archive=archive)
    # (not `guard or`: a guard with no connections is falsy, it has a length)
    if guard is None:
        guard = ConnectionGuard(ConnectionLimits(), product=PRODUCT)
    app = guarded_app(guard, authenticate, client_max_size=MAX_BODY_BYTES)
    app[STATE] = state
    app.cleanup_ctx.append(_running)
    app.router.add_get("/-/healthy", healthy)
    app.router.add_get("/-/ready", ready)
    app.router.add_get("/metrics", own_metrics)
    app.router.add_route("*", job_archive.ROUTE, archived_job)
    app.router.add_route("*", "/slurm-gpu/{tail:.*}", not_found)
    app.router.add_route("*", "/{tail:.*}", api)
    return app


async def _running(app: web.Application) -> AsyncIterator[None]:
    """The query checkers and the store's connection pools, while the app runs."""
    state = app[STATE]
    await state.checks.start()
    await state.admin_checks.start()
    await state.upstream_calls.start()
    yield
    await state.upstream_calls.close()
    await state.checks.close()
    await state.admin_checks.close()


def refuse(request: web.Request, status: int, reason: str, message: str, user: str,
           endpoint: str, retry_after: int = RETRY_AFTER_S) -> web.Response:
    """The JSON error answer, counted and logged with who asked."""
    metrics = request.app[STATE].metrics
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
async def authenticate(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Who asks (identity.py), and what they may see, on every path but the health
    probes; a handler's Refused becomes its JSON answer."""
    state = request.app[STATE]
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
        who = await identify(request, state.web_config, state.config.user_header,
                             state.munge, auth=state.basic_auth)
        if isinstance(who, Refusal):
            return refuse(request, who.status, who.reason, who.message, who.claimed,
                          "auth")
        request[CALLER] = who
        request[SCOPE] = state.config.scope_for(who.name)
        try:
            response = await handler(request)
        except Refused as exc:
            return refuse(request, exc.status, exc.reason, exc.message, who.name,
                          endpoint_name(request.path), exc.retry_after)
    response.headers.update(state.web_config.headers)
    return response


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
    state = request.app[STATE]
    archive, metrics = state.archive, state.metrics
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
    return web.Response(body=request.app[STATE].metrics.exposition(),
                        content_type="text/plain", charset="utf-8")


async def healthy(request: web.Request) -> web.Response:
    return web.Response(text="Healthy\n")


async def ready(request: web.Request) -> web.Response:
    """Ready while the store answers a query (on the admins' pool: users' cannot delay it)."""
    state = request.app[STATE]
    upstream = state.upstream
    url = upstream.with_path(upstream.path.rstrip("/") + "/api/v1/query")
    try:
        assert state.upstream_calls.admins is not None
        async with state.upstream_calls.admins.get(
                url, params={"query": "1"}, timeout=aiohttp.ClientTimeout(total=5)) as resp:
            if resp.status == 200:
                return web.Response(text="Ready\n")
            problem = f"HTTP {resp.status}"
    except (TimeoutError, aiohttp.ClientError) as exc:
        problem = type(exc).__name__
    return web.Response(status=503, text=f"upstream {state.config.prometheus_url} not "
                        f"reachable ({problem}); check --prometheus-url\n")
