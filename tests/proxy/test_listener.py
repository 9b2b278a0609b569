"""The proxy's listener (web/listen.py): past half its cap a new connection closes the
one idle the longest (so idle sockets cannot keep a caller out); only when every
connection is in a request is a new one closed at once and counted. A request body
that trickles is refused."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web

from slurm_gpu_exporter.web.connections import ConnectionGuard, ConnectionLimits
from slurm_gpu_exporter.web.listen import start
from slurm_gpu_exporter.web.middleware import guarded_app
from tests.support import free_port

GET = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"


async def _serve(busy: asyncio.Event | None, cap: int
                 ) -> tuple[web.AppRunner, ConnectionGuard, int, list[str]]:
    async def hello(request: web.Request) -> web.Response:
        if busy is not None:
            await busy.wait()  # held in a request until the test lets go
        return web.Response(text="hello")

    counted: list[str] = []
    guard = ConnectionGuard(ConnectionLimits(max_connections=cap), product="slurm-gpu-proxy",
                            on_refused=lambda: counted.append("refused"),
                            on_evicted=lambda: counted.append("evicted"))
    app = guarded_app(guard)
    app.router.add_get("/", hello)
    port = free_port()
    runner = await start(app, [f"127.0.0.1:{port}"], None, backlog=512)
    return runner, guard, port, counted


async def _held_until(guard: ConnectionGuard, n: int) -> None:
    while len(guard) < n:
        await asyncio.sleep(0.01)


async def _idle_connections_make_room() -> tuple[bytes, list[str]]:
    runner, guard, port, counted = await _serve(None, 4)
    held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(4)]
    await asyncio.wait_for(_held_until(guard, 4), 5)
    await asyncio.sleep(0.2)  # older than the guard's grace for new connections
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(GET)
    answer = await asyncio.wait_for(reader.readuntil(b"hello"), 5)
    for _, w in [*held, (reader, writer)]:
        w.close()
    await runner.cleanup()
    return answer, counted


def test_idle_connections_at_the_cap_are_closed_for_a_caller_who_asks() -> None:
    # Issue 45: 16 silent sockets at a cap of 16 refused an admin; they hold nothing now.
    answer, counted = asyncio.run(_idle_connections_make_room())
    assert answer.startswith(b"HTTP/1.1 200") and "refused" not in counted
    assert "evicted" in counted


async def _busy_connections_past_the_cap() -> tuple[bytes, list[str]]:
    busy = asyncio.Event()
    runner, _, port, counted = await _serve(busy, 2)
    held = []
    for _ in range(2):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(GET)
        held.append((reader, writer))
    await asyncio.sleep(0.3)  # both in a request
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(GET)
    answer = await asyncio.wait_for(reader.read(), 5)  # b"": closed without an answer
    busy.set()
    for _, w in [*held, (reader, writer)]:
        w.close()
    await runner.cleanup()
    return answer, counted


def test_connections_past_the_cap_are_closed_and_counted_when_all_are_busy() -> None:
    answer, refused = asyncio.run(_busy_connections_past_the_cap())
    assert answer == b"" and refused == ["refused"]


async def _slow_body_answer() -> bytes:
    import bcrypt

    from slurm_gpu_exporter.proxy.app import make_app
    from slurm_gpu_exporter.proxy.config import ProxyConfig
    from slurm_gpu_exporter.web.config import WebConfig

    web_config = WebConfig(users={"alice": bcrypt.hashpw(b"pw", bcrypt.gensalt(4))})
    app = make_app(ProxyConfig(prometheus_url="http://127.0.0.1:9"), web_config,
                   read_timeout=0.3)
    port = free_port()
    # Short lingering: the server would otherwise wait 10 s for the rest of the body.
    runner = await start(app, [f"127.0.0.1:{port}"], None, lingering_time=0.1)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"POST /api/v1/query HTTP/1.1\r\nHost: x\r\nAuthorization: Basic YWxpY2U6cHc=\r\n"
                 b"Content-Type: application/x-www-form-urlencoded\r\n"
                 b"Content-Length: 100\r\n\r\nquery=up")  # 92 bytes short, never sent
    status = await asyncio.wait_for(reader.readline(), 5)
    writer.close()
    await runner.cleanup()
    return status


@pytest.mark.process  # the app starts its query checkers
def test_a_request_body_that_trickles_is_refused_with_408() -> None:
    assert asyncio.run(_slow_body_answer()).startswith(b"HTTP/1.1 408")


async def _kept_alive_past_the_header_timeout() -> tuple[bytes, bytes]:
    from slurm_gpu_exporter.proxy.app import make_app
    from slurm_gpu_exporter.proxy.config import ProxyConfig

    # A header timeout far below the keepalive one: a connection that has had a
    # request must be held to the keepalive timeout, so the app must tell the guard.
    guard = ConnectionGuard(ConnectionLimits(header_timeout=0.05, keepalive_timeout=30),
                            product="slurm-gpu-proxy")
    app = make_app(ProxyConfig(prometheus_url="http://127.0.0.1:9"), guard=guard)
    port = free_port()
    runner = await start(app, [f"127.0.0.1:{port}"], None)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /-/healthy HTTP/1.1\r\nHost: x\r\n\r\n")
    first = await asyncio.wait_for(reader.readuntil(b"Healthy\n"), 5)
    await asyncio.sleep(0.1)
    guard.sweep()
    writer.write(b"GET /-/healthy HTTP/1.1\r\nHost: x\r\n\r\n")
    try:
        second = await asyncio.wait_for(reader.readuntil(b"Healthy\n"), 5)
    except (asyncio.IncompleteReadError, ConnectionError):
        second = b""
    writer.close()
    await runner.cleanup()
    return first, second


@pytest.mark.process  # the app starts its query checkers
def test_the_proxy_tells_the_guard_of_its_requests_so_kept_alive_ones_stay_open() -> None:
    # A flood's busy connections were closed at the header timeout (10 s) otherwise.
    first, second = asyncio.run(_kept_alive_past_the_header_timeout())
    assert first.startswith(b"HTTP/1.1 200") and second.startswith(b"HTTP/1.1 200")


def test_the_proxys_guard_names_the_proxy() -> None:
    from slurm_gpu_exporter.proxy.app import make_app
    from slurm_gpu_exporter.proxy.config import ProxyConfig
    from slurm_gpu_exporter.web.middleware import GUARD_KEY

    app = make_app(ProxyConfig(prometheus_url="http://127.0.0.1:9"))
    assert app[GUARD_KEY].product == "slurm-gpu-proxy"
