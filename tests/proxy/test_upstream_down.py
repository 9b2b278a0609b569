"""With its store down, the proxy is not ready and says so; queries get 502, counted."""

from __future__ import annotations

import asyncio

import aiohttp
import bcrypt
import pytest

from slurm_gpu_exporter.proxy.app import make_app
from slurm_gpu_exporter.proxy.config import ProxyConfig
from slurm_gpu_exporter.proxy.observe import ProxyMetrics
from slurm_gpu_exporter.web.config import WebConfig
from slurm_gpu_exporter.web.listen import start
from tests.support import free_port


async def _answers_with_the_store_down() -> tuple[int, str, int, float | None]:
    nothing_there = free_port()  # nothing listens here
    metrics = ProxyMetrics()
    web_config = WebConfig(users={"alice": bcrypt.hashpw(b"pw", bcrypt.gensalt(4))})
    app = make_app(ProxyConfig(prometheus_url=f"http://127.0.0.1:{nothing_there}"),
                   web_config, metrics)
    port = free_port()
    runner = await start(app, [f"127.0.0.1:{port}"], None)
    try:
        async with aiohttp.ClientSession() as session:
            async with session.get(f"http://127.0.0.1:{port}/-/ready") as resp:
                ready, text = resp.status, await resp.text()
            # alice:pw
            async with session.get(f"http://127.0.0.1:{port}/api/v1/query?query=up",
                                   headers={"Authorization": "Basic YWxpY2U6cHc="}) as resp:
                query = resp.status
    finally:
        await runner.cleanup()
    errors = metrics.registry.get_sample_value("slurm_gpu_proxy_upstream_errors_total",
                                               {"endpoint": "query"})
    return ready, text, query, errors


@pytest.mark.process  # the app starts its query checkers
def test_with_the_store_down_the_proxy_is_not_ready_and_queries_get_502() -> None:
    ready, text, query, errors = asyncio.run(_answers_with_the_store_down())
    assert ready == 503 and "not reachable" in text and "--prometheus-url" in text
    assert query == 502 and errors == 1
