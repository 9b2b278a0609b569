"""A stand-in for MLflow's REST API (2.0) in the test's own event loop: an aiohttp
server on 127.0.0.1 that records every request and answers what the test scripts, over
plain HTTP or TLS. No process: the fast tier's stand-in for a real tracking server."""

from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

API = "/api/2.0/mlflow/"


@dataclass(frozen=True)
class Seen:
    """One request as the server got it: its path, the API method (the path after the
    API's prefix), its headers and JSON body."""

    path: str
    method: str
    headers: dict[str, str]
    body: Any


@dataclass
class Answer:
    """What the server says: a status and a body (a dict or list is sent as JSON, a
    str as it is), after ``delay_s``."""

    status: int = 200
    body: Any = field(default_factory=dict)
    delay_s: float = 0.0


Script = Callable[[Seen], Answer]


@dataclass
class StandIn:
    url: str
    seen: list[Seen]


@asynccontextmanager
async def mlflow_stand_in(script: Script = lambda seen: Answer(),
                          tls: ssl.SSLContext | None = None) -> AsyncIterator[StandIn]:
    """Serve ``script``'s answers on a port of 127.0.0.1 until the block ends."""
    seen: list[Seen] = []

    async def handle(request: web.Request) -> web.Response:
        text = await request.text()
        got = Seen(request.path, request.path.partition(API)[2], dict(request.headers),
                   json.loads(text) if text else None)
        seen.append(got)
        answer = script(got)
        if answer.delay_s:
            await asyncio.sleep(answer.delay_s)
        body = answer.body if isinstance(answer.body, str) else json.dumps(answer.body)
        return web.Response(status=answer.status, text=body, content_type="application/json")

    app = web.Application()
    app.router.add_post("/{tail:.*}", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=tls)
    await site.start()
    port = runner.addresses[0][1]
    scheme = "https" if tls is not None else "http"
    try:
        yield StandIn(f"{scheme}://127.0.0.1:{port}", seen)
    finally:
        await runner.cleanup()
