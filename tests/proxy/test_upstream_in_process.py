"""The proxy's calls to its store in process, against a small aiohttp store on a
loopback port: answers passed on as they came, one past the size cap and a store that
is down each a 502 that says why, counted and logged; each user's share of the store."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from yarl import URL

from slurm_gpu_exporter.proxy.fairness import Busy, FairLimits
from slurm_gpu_exporter.proxy.observe import ProxyMetrics
from slurm_gpu_exporter.proxy.upstream import Upstream


async def _answer(request: web.Request) -> web.Response:
    if request.path == "/slow":
        await asyncio.sleep(float(request.query.get("s", "0.2")))
    return web.Response(status=int(request.query.get("status", "200")),
                        body=b'{"status":"success","data":[1,2,3]}',
                        content_type="application/json")


def with_store(test: Callable[[URL, Upstream, ProxyMetrics], Awaitable[Any]],
               limits: FairLimits | None = None) -> Any:
    async def run() -> Any:
        app = web.Application()
        app.router.add_get("/{tail:.*}", _answer)
        server = TestServer(app, host="127.0.0.1")
        await server.start_server()
        metrics = ProxyMetrics()
        upstream = Upstream(str(server.make_url("/")), 5.0, limits or FairLimits(), metrics)
        await upstream.start()
        try:
            return await test(server.make_url("/"), upstream, metrics)
        finally:
            await upstream.close()
            await server.close()
    return asyncio.run(run())


def value(metrics: ProxyMetrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def test_the_stores_answer_is_passed_on_and_counted() -> None:
    async def test(base: URL, upstream: Upstream, metrics: ProxyMetrics) -> None:
        answer = await upstream.call("query", "GET", base.with_path("/api/v1/query"),
                                     "alice", False)
        assert (answer.status, answer.body, answer.content_type) == (
            200, b'{"status":"success","data":[1,2,3]}', "application/json")
        answer = await upstream.call("query", "GET", base.with_query(status="422"),
                                     "root", True)
        assert answer.status == 422
        assert value(metrics, "slurm_gpu_proxy_requests_total", endpoint="query",
                     code="200") == 1.0
        assert value(metrics, "slurm_gpu_proxy_requests_total", endpoint="query",
                     code="422") == 1.0
        assert value(metrics, "slurm_gpu_proxy_upstream_duration_seconds_count",
                     endpoint="query") == 2.0
    with_store(test)


def test_an_answer_past_the_cap_is_a_502_naming_the_limit(
        caplog: pytest.LogCaptureFixture) -> None:
    async def test(base: URL, upstream: Upstream, metrics: ProxyMetrics) -> None:
        with caplog.at_level(logging.WARNING):
            answer = await upstream.call("series", "GET", base, "alice", False)
        assert answer.status == 502
        assert json.loads(answer.text) == {
            "status": "error", "errorType": "too_large",
            "error": "the store's answer is larger than this proxy's limit of 10 bytes "
                     "(--limits.upstream-body-bytes); ask for less: a shorter range, a "
                     "larger step, fewer series"}
        assert caplog.messages == ["upstream answer to series larger than 10 bytes: refused"]
        assert value(metrics, "slurm_gpu_proxy_upstream_errors_total", endpoint="series") == 1
        assert value(metrics, "slurm_gpu_proxy_requests_total", endpoint="series",
                     code="502") == 1.0
    with_store(test, FairLimits(upstream_body_bytes=10))


def test_an_answer_of_exactly_the_cap_is_passed_on() -> None:
    async def test(base: URL, upstream: Upstream, metrics: ProxyMetrics) -> None:
        assert (await upstream.call("series", "GET", base, "alice", False)).status == 200
    with_store(test, FairLimits(upstream_body_bytes=len(b'{"status":"success","data":[1,2,3]}')))


def test_a_store_that_is_down_is_a_502_that_says_so(caplog: pytest.LogCaptureFixture) -> None:
    async def test(base: URL, upstream: Upstream, metrics: ProxyMetrics) -> None:
        down = URL("http://127.0.0.1:9/api/v1/query")  # the discard port: nothing listens
        with caplog.at_level(logging.WARNING):
            answer = await upstream.call("query", "GET", down, "alice", False)
        assert answer.status == 502
        body = json.loads(answer.text)
        assert (body["status"], body["errorType"]) == ("error", "unavailable")
        assert body["error"].startswith("the Prometheus behind this proxy did not answer (")
        assert body["error"].endswith("); try again, or tell its admins")
        [line] = caplog.messages
        assert line.startswith(f"upstream {base} did not answer query: ")
        assert value(metrics, "slurm_gpu_proxy_upstream_errors_total", endpoint="query") == 1
    with_store(test)


def test_each_user_has_their_own_share_of_the_store_and_admins_none() -> None:
    async def test(base: URL, upstream: Upstream, metrics: ProxyMetrics) -> None:
        slow = base.with_path("/slow").with_query(s="0.3")
        first = asyncio.create_task(upstream.call("query", "GET", slow, "alice", False))
        await asyncio.sleep(0.1)
        with pytest.raises(Busy):  # alice's one request is at the store, none may wait
            await upstream.call("query", "GET", base, "alice", False)
        # bob and an admin are not held up by alice's
        assert (await upstream.call("query", "GET", base, "bob", False)).status == 200
        assert (await upstream.call("query", "GET", base, "alice", True)).status == 200
        assert (await first).status == 200
    with_store(test, FairLimits(upstream_per_user=1, waiting_per_user=0))
