"""The HTTP side, through the app factory: aiohttp's test client on a random port."""

from __future__ import annotations

import asyncio
import dataclasses
import gzip
import socket
import threading
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import bcrypt
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from slurm_gpu_exporter.exposition.rendered import render
from slurm_gpu_exporter.exposition.snapshot import Snapshot
from slurm_gpu_exporter.web.basic_auth import BasicAuth
from slurm_gpu_exporter.web.config import WebConfig, parse_web_config
from slurm_gpu_exporter.web.listen import ListenError, parse_listen_address, start
from slurm_gpu_exporter.web.middleware import GUARD_KEY
from slurm_gpu_exporter.web.server import ExpositionHolder, make_app
from tests.support import basic_auth, free_port

HASH = bcrypt.hashpw(b"good", bcrypt.gensalt(rounds=4)).decode()


def _with_client(app: web.Application,
                 body: Callable[[TestClient[Any, Any]], Awaitable[None]]) -> None:
    async def run() -> None:
        async with TestClient(TestServer(app)) as client:
            await body(client)

    asyncio.run(run())


def _holder_with_sample(timestamp: float | None = None) -> ExpositionHolder:
    holder = ExpositionHolder()
    snapshot = Snapshot(timestamp=timestamp if timestamp is not None else _now())
    holder.publish(render(snapshot))
    return holder


def _now() -> float:
    import time

    return time.time()


def test_healthy_and_ready_answer_503_until_the_first_sample_completes() -> None:
    holder = ExpositionHolder()

    async def body(client: TestClient[Any, Any]) -> None:
        for path in ("/-/healthy", "/-/ready", "/metrics"):
            resp = await client.get(path)
            assert resp.status == 503, path
        holder.publish(render(Snapshot(timestamp=_now())))
        for path in ("/-/healthy", "/-/ready", "/metrics"):
            resp = await client.get(path)
            assert resp.status == 200, path

    _with_client(make_app(holder), body)


def test_healthy_fails_when_the_last_sample_is_stale() -> None:
    holder = _holder_with_sample(timestamp=_now() - 1000)
    holder.stale_after = 300

    async def body(client: TestClient[Any, Any]) -> None:
        resp = await client.get("/-/healthy")
        assert resp.status == 503
        assert "stuck" in await resp.text()
        assert (await client.get("/-/ready")).status == 200

    _with_client(make_app(holder), body)


def test_metrics_serves_text_or_openmetrics_plain_or_gzip_as_asked() -> None:
    holder = _holder_with_sample()
    exposition = holder.current
    assert exposition is not None

    async def body(client: TestClient[Any, Any]) -> None:
        resp = await client.get("/metrics", headers={"Accept-Encoding": "identity"})
        assert resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        assert await resp.read() == exposition.text
        resp = await client.get("/metrics", headers={
            "Accept": "application/openmetrics-text; version=1.0.0",
            "Accept-Encoding": "gzip"}, auto_decompress=False)
        assert resp.headers["Content-Type"].startswith("application/openmetrics-text")
        assert resp.headers["Content-Encoding"] == "gzip"
        assert gzip.decompress(await resp.read()) == exposition.openmetrics
        # q=0 refuses a format
        resp = await client.get("/metrics", headers={
            "Accept": "application/openmetrics-text;q=0, text/plain",
            "Accept-Encoding": "gzip;q=0"})
        assert resp.headers["Content-Type"].startswith("text/plain")
        assert "Content-Encoding" not in resp.headers

    _with_client(make_app(holder), body)


PROMETHEUS = {"Accept": "application/openmetrics-text;version=1.0.0", "Accept-Encoding": "gzip"}


def test_scrapes_of_one_snapshot_render_it_once_per_format_and_a_new_snapshot_again() -> None:
    holder = _holder_with_sample()
    first = holder.current
    assert first is not None and first.renders == 0  # publishing rendered nothing

    async def body(client: TestClient[Any, Any]) -> None:
        for _ in range(3):
            assert (await client.get("/metrics", headers=PROMETHEUS)).status == 200
        assert (first.renders, first.compressions) == (1, 1)
        await client.get("/metrics", headers={"Accept-Encoding": "identity"})
        await client.get("/metrics", headers={"Accept-Encoding": "identity"})
        assert (first.renders, first.compressions) == (2, 1)  # text, no gzip
        holder.publish(render(Snapshot(timestamp=_now())))
        second = holder.current
        assert second is not None and second is not first
        resp = await client.get("/metrics", headers=PROMETHEUS, auto_decompress=False)
        assert gzip.decompress(await resp.read()) == second.openmetrics
        assert (second.renders, second.compressions) == (1, 1)
        assert (first.renders, first.compressions) == (2, 1)

    _with_client(make_app(holder), body)


def test_concurrent_first_scrapes_of_a_snapshot_render_it_once() -> None:
    holder = _holder_with_sample()
    exposition = holder.current
    assert exposition is not None

    async def body(client: TestClient[Any, Any]) -> None:
        responses = await asyncio.gather(*(client.get("/metrics", headers=PROMETHEUS,
                                                      auto_decompress=False)
                                           for _ in range(8)))
        bodies = {await r.read() for r in responses}
        assert len(bodies) == 1
        assert (exposition.renders, exposition.compressions) == (1, 1)

    _with_client(make_app(holder), body)


def test_health_checks_answer_while_a_first_scrape_renders() -> None:
    holder = _holder_with_sample()
    exposition = holder.current
    assert exposition is not None
    rendering, release = threading.Event(), threading.Event()
    real_render = exposition._render

    def slow_render(openmetrics: bool, gzipped: bool) -> bytes:
        rendering.set()
        assert release.wait(10)
        return real_render(openmetrics, gzipped)

    exposition._render = slow_render  # type: ignore[method-assign]

    async def body(client: TestClient[Any, Any]) -> None:
        scrape = asyncio.ensure_future(client.get("/metrics"))
        assert await asyncio.get_running_loop().run_in_executor(None, rendering.wait, 10)
        # The render holds a worker thread, not the event loop.
        assert (await client.get("/-/healthy")).status == 200
        assert (await client.get("/-/ready")).status == 200
        release.set()
        assert (await scrape).status == 200

    try:
        _with_client(make_app(holder), body)
    finally:
        release.set()


def test_basic_auth_and_configured_headers_apply_to_every_endpoint() -> None:
    config = parse_web_config({"basic_auth_users": {"prom": HASH},
                               "http_server_config": {"headers": {"X-Frame-Options": "deny"}}},
                              Path("."))
    holder = _holder_with_sample()

    async def body(client: TestClient[Any, Any]) -> None:
        for path in ("/", "/metrics", "/-/healthy", "/-/ready"):
            resp = await client.get(path)
            assert resp.status == 401, path
            assert resp.headers["WWW-Authenticate"].startswith("Basic")
            resp = await client.get(path, headers={"Authorization": basic_auth("prom", "bad")})
            assert resp.status == 401, path
            resp = await client.get(path, headers={"Authorization": basic_auth("prom", "good")})
            assert resp.status == 200, path
            assert resp.headers["X-Frame-Options"] == "deny"

    _with_client(make_app(holder, config), body)


def test_listen_addresses_are_parsed_or_refused() -> None:
    assert parse_listen_address(":9817") == (None, 9817)
    assert parse_listen_address("127.0.0.1:1") == ("127.0.0.1", 1)
    assert parse_listen_address("[::1]:9817") == ("::1", 9817)
    for bad in ("9817", "host:", "host:http", "host:70000"):
        try:
            parse_listen_address(bad)
        except ValueError as exc:
            assert bad in str(exc)
        else:
            raise AssertionError(f"{bad!r} was accepted")


def _listening_app(events: list[str]) -> web.Application:
    """The agent's app, with a start-up and a clean-up hook that note they ran."""
    app = make_app(_holder_with_sample())

    async def hooks(app: web.Application):  # type: ignore[no-untyped-def]
        events.append("started")
        yield
        events.append("cleaned up")

    app.cleanup_ctx.append(hooks)
    return app


def test_start_listens_with_the_apps_guard_and_cleanup_stops_it() -> None:
    async def run() -> tuple[int, bytes, list[str], list[str]]:
        events: list[str] = []
        announced: list[str] = []
        app = _listening_app(events)
        port = free_port()
        runner = await start(app, [f"127.0.0.1:{port}"], None,
                             announce=lambda bound: announced.append(bound.url))
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /-/ready HTTP/1.1\r\nHost: x\r\n\r\n")
        answer = await asyncio.wait_for(reader.readuntil(b"Ready\n"), 5)
        held = len(app[GUARD_KEY])
        writer.close()
        await runner.cleanup()
        return held, answer, events, announced

    held, answer, events, announced = asyncio.run(run())
    assert held == 1 and answer.startswith(b"HTTP/1.1 200")
    assert events == ["started", "cleaned up"]
    assert announced and announced[0].startswith("http://127.0.0.1:")


def test_an_address_in_use_is_a_listen_error_and_nothing_is_left_running() -> None:
    async def run() -> tuple[str, list[str], bool]:
        events: list[str] = []
        app = _listening_app(events)
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            address = f"127.0.0.1:{taken.getsockname()[1]}"
            try:
                await start(app, [f"127.0.0.1:{free_port()}", address], None)
            except ListenError as exc:
                return str(exc), events, address in str(exc)
        raise AssertionError("a port in use was listened on")

    message, events, named = asyncio.run(run())
    assert named and "in use" in message
    assert events == ["started", "cleaned up"]


def test_a_failing_start_up_hook_is_raised_as_it_is_not_as_a_listen_error() -> None:
    async def run() -> None:
        app = make_app(_holder_with_sample())

        async def broken(app: web.Application) -> None:
            raise OSError("no worker process")

        app.on_startup.append(broken)
        await start(app, [f"127.0.0.1:{free_port()}"], None)

    with pytest.raises(OSError, match="no worker process"):
        asyncio.run(run())


def test_the_agents_guard_names_the_agent() -> None:
    assert make_app(ExpositionHolder())[GUARD_KEY].product == "slurm-gpu-exporter"


@contextmanager
def _serving(app: web.Application) -> Iterator[str]:
    """Run the app on its own event loop in a thread (as the agent does); yields its URL."""
    started = threading.Event()
    state: dict[str, Any] = {}

    async def serve() -> None:
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        state["port"] = runner.addresses[0][1]
        state["stop"] = asyncio.Event()
        started.set()
        await state["stop"].wait()
        await runner.cleanup()

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_until_complete, args=(serve(),), daemon=True)
    thread.start()
    assert started.wait(10)
    try:
        yield f"http://127.0.0.1:{state['port']}"
    finally:
        loop.call_soon_threadsafe(state["stop"].set)
        thread.join(10)
        loop.close()


def _status(url: str, auth: str) -> int:
    request = urllib.request.Request(url, headers={"Authorization": auth})
    try:
        with urllib.request.urlopen(request, timeout=20) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_a_wrong_password_being_checked_does_not_stall_other_scrapes() -> None:
    # The wrong password's bcrypt check is held open until the good scrapes are done.
    # If the check ran on the event loop, no good scrape could be answered meanwhile:
    # they would time out, and the held checks would finish first.
    release = threading.Event()
    checking = threading.Semaphore(0)
    order: list[str] = []
    order_lock = threading.Lock()

    def slow_on_wrong(password: bytes, hashed: bytes) -> bool:
        if password == b"good":
            return bcrypt.checkpw(password, hashed)
        checking.release()
        release.wait(30)
        return False

    config = parse_web_config({"basic_auth_users": {"prom": HASH}}, Path("."))
    config = dataclasses.replace(config, password_check=slow_on_wrong)
    good = basic_auth("prom", "good")

    def scrape(name: str, auth: str, url: str) -> int:
        status = _status(url, auth)
        with order_lock:
            order.append(name)
        return status

    with _serving(make_app(_holder_with_sample(), config)) as base, \
            ThreadPoolExecutor(max_workers=8) as pool:
        assert _status(base + "/metrics", good) == 200  # verified once, then cached
        # Two different wrong passwords: one password on many connections is checked once.
        wrongs = [pool.submit(scrape, f"wrong{i}", basic_auth("prom", f"wrong{i}"),
                              base + "/metrics")
                  for i in range(2)]
        for _ in range(2):  # both wrong checks are now running, and held
            assert checking.acquire(timeout=10)
        goods = [pool.submit(scrape, f"good{i}", good, base + "/metrics") for i in range(4)]
        good_statuses = [f.result(timeout=30) for f in goods]
        release.set()
        wrong_statuses = [f.result(timeout=30) for f in wrongs]
    assert good_statuses == [200] * 4
    assert wrong_statuses == [401, 401]
    # Every good scrape was answered while both wrong checks were still in progress.
    assert sorted(order[:4]) == [f"good{i}" for i in range(4)], order


def test_the_synchronous_check_gives_the_same_answers() -> None:
    config = WebConfig(users={"prom": HASH.encode()})
    auth = BasicAuth()
    assert auth.check(config, basic_auth("prom", "good"))
    assert not auth.check(config, basic_auth("prom", "wrong"))

    async def both() -> tuple[bool, bool]:
        return (await auth.check_async(config, basic_auth("prom", "good")),
                await auth.check_async(config, basic_auth("prom", "wrong")))

    assert asyncio.run(both()) == (True, False)
