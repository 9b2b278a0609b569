"""A stand-in store in front of a real Prometheus that holds some queries: every request
goes on to Prometheus, after ``delay`` seconds when its query names ``slow_metric``
(a real store can hold a query up to its own timeout). Runs on a thread of its own."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import aiohttp
from aiohttp import web

from tests.support import free_port

SLOW_MARK = "slow_metric"


@contextmanager
def slow_store(prometheus_url: str, delay: float) -> Iterator[str]:
    """The stand-in's URL while the block runs."""
    port = free_port()
    stop = threading.Event()
    ready = threading.Event()

    async def forward(request: web.Request) -> web.Response:
        form = list(request.query.items())
        if request.method == "POST":
            form += list((await request.post()).items())
        if any(SLOW_MARK in str(value) for _, value in form):
            await asyncio.sleep(delay)
        async with aiohttp.ClientSession() as session, session.request(
                "POST", prometheus_url + request.path, data=form) as resp:
            return web.Response(status=resp.status, body=await resp.read(),
                                content_type=resp.content_type)

    async def serve() -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", forward)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        ready.set()
        while not stop.is_set():
            await asyncio.sleep(0.1)
        await runner.cleanup()

    thread = threading.Thread(target=lambda: asyncio.run(serve()), daemon=True)
    thread.start()
    if not ready.wait(10):
        raise TimeoutError("the stand-in store did not start")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        stop.set()
        thread.join(10)
