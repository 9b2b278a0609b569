"""The Prometheus HTTP API behind the proxy: its read endpoints, restricted for users,
and everything else passed through for admins.

The read endpoints that Grafana and slurm-gpu-report use are open to every
authenticated caller, with their queries and ``match[]`` selectors restricted
(query/restrict.py). What goes upstream is built by the proxy: a fixed path and a fresh form
of checked parameters, never the client's own path, query string or headers.
Handlers read the app's state (``request.app[STATE]``) and say no by raising Refused.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from urllib.parse import quote, urlencode

from aiohttp import web
from yarl import URL

from slurm_gpu_exporter.proxy.fairness import BackingOff, Busy
from slurm_gpu_exporter.proxy.params import FORM, BadRequest, pick, read_params, single
from slurm_gpu_exporter.proxy.query.check_pool import CheckBusy
from slurm_gpu_exporter.proxy.query.limits import (
    LimitExceeded,
    check_query_text,
    check_regex_repetition,
)
from slurm_gpu_exporter.proxy.query.printer import LABEL_NAME
from slurm_gpu_exporter.proxy.query.restrict import QueryRefused, Scope, default_series_selectors
from slurm_gpu_exporter.proxy.state import (
    CALLER,
    RETRY_AFTER_S,
    SCOPE,
    STATE,
    ProxyState,
    Refused,
)

# Upstream requests go as GET (one write on the socket, where a POST takes two) while
# the URL stays short enough for any proxy on the way; longer ones as a POST form.
UPSTREAM_GET_BYTES = 4096


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


async def api(request: web.Request) -> web.StreamResponse:
    """Every path but the proxy's own: a read endpoint, restricted; else an admin's."""
    path = request.path
    endpoint = ENDPOINTS.get(path)
    if endpoint is not None and request.method in ("GET", "POST"):
        if request.method == "POST" and not endpoint.post:
            raise Refused(405, "method", f"{path} takes GET only")
        return await _read_endpoint(request, path, endpoint)
    label = label_values_name(path)
    if label is not None and request.method == "GET":
        return await _read_endpoint(request, f"/api/v1/label/{label}/values", LABEL_VALUES)
    if request[SCOPE].admin:
        return await _passthrough(request)
    raise Refused(403, "endpoint", f"{request.method} {path} is for admins only; users "
                  "may query, query_range, series, labels, label values and metadata")


async def _call_upstream(state: ProxyState, endpoint: str, method: str, url: URL,
                         caller: str, admin: bool, **kwargs: object) -> web.Response:
    try:
        return await state.upstream_calls.call(endpoint, method, url, caller, admin,
                                               **kwargs)
    except Busy as exc:
        raise Refused(503, "busy", f"{exc}; retry in {exc.retry_after} s",
                      exc.retry_after) from None


async def _restricted(state: ProxyState, kind: str, text: str, scope: Scope,
                      caller: str) -> str:
    """``text`` (a query or a selector) restricted to what ``scope`` may see, checked
    within the caller's share of the checkers."""
    try:
        # At once: what is past the limits never waits.
        check_query_text(text)
        check_regex_repetition(text)
        if scope.admin:
            return await state.admin_checks.check(kind, text, scope)
        state.backoff.check(caller)
        async with state.check_share.slot(caller):
            state.backoff.check(caller)  # struck while this one waited
            try:
                return await state.checks.check(kind, text, scope)
            except QueryRefused as exc:
                if exc.reason == "slow_query":
                    wait = state.backoff.strike(caller)
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


async def _read_endpoint(request: web.Request, path: str, endpoint: Endpoint
                         ) -> web.Response:
    state = request.app[STATE]
    scope: Scope = request[SCOPE]
    caller: str = request[CALLER].name
    try:
        try:
            async with asyncio.timeout(state.read_timeout):
                params = await read_params(request)
        except TimeoutError:
            raise Refused(408, "slow_request", f"the request body did not arrive within "
                          f"{state.read_timeout:g} s; send it at once") from None
        form = pick(params, endpoint.others)
        if endpoint.query is not None:
            query = single(params, endpoint.query, endpoint.query_required)
            if query is not None:
                form.append((endpoint.query, await _restricted(state, "query", query, scope,
                                                               caller)))
        if endpoint.matches:
            selectors = params.getall("match[]", [])
            if endpoint.matches_required and not selectors:
                raise BadRequest("at least one match[] series selector is needed")
            for selector in selectors:
                form.append(("match[]", await _restricted(state, "selector", selector,
                                                          scope, caller)))
            if not selectors and not scope.admin:
                # Without match[], label names and values would come from every series.
                form += [("match[]", s) for s in default_series_selectors(scope)]
    except BadRequest as exc:
        raise Refused(400, "bad_request", str(exc)) from None
    upstream = state.upstream
    url = upstream.with_path(upstream.path.rstrip("/") + path, encoded=False)
    encoded = urlencode(form, quote_via=quote)
    if endpoint.post and len(encoded) > UPSTREAM_GET_BYTES:
        return await _call_upstream(state, endpoint.name, "POST", url, caller, scope.admin,
                                    data=encoded, headers={"Content-Type": FORM})
    return await _call_upstream(state, endpoint.name, "GET",
                                URL(f"{url}?{encoded}", encoded=True), caller, scope.admin)


async def _passthrough(request: web.Request) -> web.Response:
    """An admin's request as it came (path, query string, body), to the same store."""
    state = request.app[STATE]
    body = await request.read()
    url = URL(str(state.upstream).rstrip("/") + request.raw_path, encoded=True)
    headers = {"Content-Type": request.headers["Content-Type"]} if (
        "Content-Type" in request.headers) else {}
    return await _call_upstream(state, "admin_passthrough", request.method, url,
                                request[CALLER].name, True, data=body, headers=headers)


def label_values_name(path: str) -> str | None:
    """``name`` of ``/api/v1/label/<name>/values`` when it is a valid label name."""
    prefix, suffix = "/api/v1/label/", "/values"
    if not (path.startswith(prefix) and path.endswith(suffix)):
        return None
    name = path[len(prefix):-len(suffix)]
    return name if LABEL_NAME.fullmatch(name) else None


def endpoint_name(path: str) -> str:
    """The ``endpoint`` label of a request to ``path`` in the proxy's own metrics."""
    if path.startswith("/slurm-gpu/"):
        return "archive_job"
    if path in ENDPOINTS:
        return ENDPOINTS[path].name
    return "label_values" if label_values_name(path) else "other"
