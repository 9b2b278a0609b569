"""What the proxy takes before it authenticates: the health paths only for GET and HEAD
(issue 42: ``POST /-/healthy`` reached the API handler and logged a traceback), and
only request targets that are paths (an absolute-form ``GET http://evil/…`` was glued
onto the store's URL). In process, with a recording store behind the proxy and the
query checkers replaced by a stand-in, so that no process starts."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import bcrypt
import pytest
from aiohttp import web

from slurm_gpu_exporter.proxy.app import make_app
from slurm_gpu_exporter.proxy.config import ProxyConfig
from slurm_gpu_exporter.proxy.query.restrict import Scope
from slurm_gpu_exporter.web.config import WebConfig
from slurm_gpu_exporter.web.listen import start
from tests.support import free_port


class NoChecks:
    """Stands for the query checker pool: takes every query as it is."""

    async def start(self) -> None:
        pass

    async def close(self) -> None:
        pass

    async def check(self, kind: str, text: str, scope: Scope) -> str:
        return text


@dataclass
class Running:
    port: int
    upstream_seen: list[str] = field(default_factory=list)


def _auth(user: str) -> bytes:
    return b"Authorization: Basic " + base64.b64encode(f"{user}:pw".encode()) + b"\r\n"


@asynccontextmanager
async def _proxy() -> AsyncIterator[Running]:
    seen: list[str] = []

    async def store(request: web.Request) -> web.Response:
        seen.append(request.raw_path)
        return web.json_response({"status": "success", "data": []})

    upstream_app = web.Application()
    upstream_app.router.add_route("*", "/{tail:.*}", store)
    upstream = web.AppRunner(upstream_app, access_log=None)
    await upstream.setup()
    upstream_port = free_port()
    await web.TCPSite(upstream, "127.0.0.1", upstream_port).start()
    hashed = bcrypt.hashpw(b"pw", bcrypt.gensalt(4))
    app = make_app(ProxyConfig(prometheus_url=f"http://127.0.0.1:{upstream_port}",
                               admins=frozenset({"root"})),
                   WebConfig(users={"alice": hashed, "root": hashed}),
                   checks=NoChecks(), admin_checks=NoChecks())  # type: ignore[arg-type]
    port = free_port()
    runner = await start(app, [f"127.0.0.1:{port}"], None)
    try:
        yield Running(port, seen)
    finally:
        await runner.cleanup()
        await upstream.cleanup()


async def _raw(port: int, head: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send the request line and headers as they are; (status, headers, body)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(head + b"Host: 127.0.0.1\r\nConnection: close\r\n\r\n")
    reply = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    top, _, body = reply.partition(b"\r\n\r\n")
    lines = top.decode().split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    return int(lines[0].split(" ")[1]), headers, body


def _run_health(method: bytes, path: bytes) -> tuple[int, dict[str, str], bytes, list[str]]:
    async def go() -> tuple[int, dict[str, str], bytes, list[str]]:
        async with _proxy() as running:
            status, headers, body = await _raw(
                running.port, method + b" " + path + b" HTTP/1.1\r\nContent-Length: 0\r\n")
            return status, headers, body, running.upstream_seen
    return asyncio.run(go())


@pytest.mark.parametrize(("method", "path"), [
    (b"POST", b"/-/healthy"), (b"PUT", b"/-/ready"), (b"DELETE", b"/-/healthy")])
def test_other_methods_on_a_health_path_get_405_without_a_traceback(
        method: bytes, path: bytes, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG):
        status, headers, body, upstream = _run_health(method, path)
    assert status == 405, body
    assert headers["Allow"] == "GET, HEAD"
    assert json.loads(body)["errorType"] == "method"
    assert upstream == []
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR], \
        caplog.text


@pytest.mark.parametrize("method", [b"GET", b"HEAD"])
def test_probes_read_the_health_path_without_credentials(method: bytes) -> None:
    status, _, body, _ = _run_health(method, b"/-/healthy")
    assert status == 200
    assert body == (b"Healthy\n" if method == b"GET" else b"")


def _run_target(target: bytes, user: str, method: bytes = b"GET"
                ) -> tuple[int, bytes, list[str]]:
    async def go() -> tuple[int, bytes, list[str]]:
        async with _proxy() as running:
            status, _, body = await _raw(running.port, method + b" " + target
                                         + b" HTTP/1.1\r\nContent-Length: 0\r\n"
                                         + _auth(user))
            return status, body, running.upstream_seen
    return asyncio.run(go())


@pytest.mark.parametrize(("method", "target", "user"), [
    (b"GET", b"http://evil.example/api/v1/query?query=up", "alice"),  # restricted
    (b"GET", b"http://evil.example/federate?match[]=up", "root"),  # admin passthrough
    (b"POST", b"https://127.0.0.1:1/api/v1/admin/tsdb/snapshot", "root"),
    (b"OPTIONS", b"*", "root"),
    (b"CONNECT", b"evil.example:443", "root"),
], ids=["absolute-query", "absolute-admin-passthrough", "absolute-https", "asterisk",
        "authority"])
def test_a_target_that_is_not_a_path_is_400_and_never_forwarded(
        method: bytes, target: bytes, user: str) -> None:
    status, body, upstream = _run_target(target, user, method)
    assert status == 400, body
    answer = json.loads(body)
    assert answer["errorType"] == "request_target"
    assert "origin-form" in answer["error"]
    assert upstream == []


def test_a_path_target_still_reaches_the_store() -> None:
    # The truth for the refusals above: the same requests as paths are answered.
    status, body, upstream = _run_target(b"/federate?match[]=up", "root")
    assert status == 200, body
    assert upstream == ["/federate?match[]=up"]
