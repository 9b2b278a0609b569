"""The proxy's listener: connections past its cap are closed at once and counted; a
request body that trickles is refused."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web

from slurm_gpu_exporter.proxy.listener import listen
from tests.support import free_port


async def _connections_past_the_cap_are_closed() -> tuple[bytes, int]:
    async def hello(request: web.Request) -> web.Response:
        return web.Response(text="hello")

    app = web.Application()
    app.router.add_get("/", hello)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    refused: list[int] = []
    port = free_port()
    servers = await listen(runner, [f"127.0.0.1:{port}"], None,
                           on_refused=lambda: refused.append(1), max_connections=2)
    held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(2)]
    async def both_taken() -> None:
        while len(runner.server.connections) < 2:
            await asyncio.sleep(0.01)

    await asyncio.wait_for(both_taken(), 5)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    answer = await asyncio.wait_for(reader.read(), 5)  # b"": closed without an answer
    for _, w in [*held, (reader, writer)]:
        w.close()
    for server in servers:
        server.close()
    await runner.cleanup()
    return answer, len(refused)


def test_connections_past_the_cap_are_closed_and_counted() -> None:
    answer, refused = asyncio.run(_connections_past_the_cap_are_closed())
    assert answer == b"" and refused == 1


async def _slow_body_answer() -> bytes:
    import bcrypt

    from slurm_gpu_exporter.proxy.app import make_app
    from slurm_gpu_exporter.proxy.config import ProxyConfig
    from slurm_gpu_exporter.web.config import WebConfig

    web_config = WebConfig(users={"alice": bcrypt.hashpw(b"pw", bcrypt.gensalt(4))})
    app = make_app(ProxyConfig(prometheus_url="http://127.0.0.1:9"), web_config,
                   read_timeout=0.3)
    # Short lingering: the server would otherwise wait 10 s for the rest of the body.
    runner = web.AppRunner(app, access_log=None, lingering_time=0.1)
    await runner.setup()
    port = free_port()
    servers = await listen(runner, [f"127.0.0.1:{port}"], None)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"POST /api/v1/query HTTP/1.1\r\nHost: x\r\nAuthorization: Basic YWxpY2U6cHc=\r\n"
                 b"Content-Type: application/x-www-form-urlencoded\r\n"
                 b"Content-Length: 100\r\n\r\nquery=up")  # 92 bytes short, never sent
    status = await asyncio.wait_for(reader.readline(), 5)
    writer.close()
    for server in servers:
        server.close()
    await runner.cleanup()
    return status


@pytest.mark.process  # the app starts its query checkers
def test_a_request_body_that_trickles_is_refused_with_408() -> None:
    assert asyncio.run(_slow_body_answer()).startswith(b"HTTP/1.1 408")
