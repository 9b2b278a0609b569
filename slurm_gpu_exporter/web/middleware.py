"""What every server's application stands on: its connection guard, told which
connections are in a request, and the web config's client authentication.

``guarded_app`` makes an application whose first middleware marks each request in
progress on the guard (connections.py), so a connection being answered is never
closed as idle; ``listen.start`` puts the listeners' connections under the same guard.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from slurm_gpu_exporter.web.basic_auth import AuthBusy, BasicAuth
from slurm_gpu_exporter.web.config import WebConfig
from slurm_gpu_exporter.web.connections import ConnectionGuard

GUARD_KEY = web.AppKey("connection_guard", ConnectionGuard)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Middleware = Callable[[web.Request, Handler], Awaitable[web.StreamResponse]]


def guard_middleware(guard: ConnectionGuard) -> Middleware:
    """Marks each request in progress on its connection, so the guard (connection cap,
    header and idle timeouts) never closes a connection that is being answered."""

    @web.middleware
    async def in_progress(request: web.Request, handler: Handler) -> web.StreamResponse:
        with guard.request(request.transport):
            return await handler(request)

    return in_progress


def guarded_app(guard: ConnectionGuard, *middlewares: Middleware,
                **kwargs: Any) -> web.Application:
    """An application whose connections ``guard`` watches (``listen.start`` takes it
    from ``app[GUARD_KEY]``), with ``middlewares`` after the guard's own; ``kwargs``
    go to ``web.Application``."""
    app = web.Application(middlewares=[guard_middleware(guard), *middlewares], **kwargs)
    app[GUARD_KEY] = guard
    return app


def auth_middleware(config_of: Callable[[], WebConfig], realm: str,
                    open_paths: frozenset[str] = frozenset()) -> Middleware:
    """The web config's client certificates and basic auth, and its response headers,
    on every path but ``open_paths`` (health probes that say nothing but "up"). Each
    request is checked against the config ``config_of`` gives then; what the checks
    keep (verified credentials, bcrypt threads) is this middleware's own, across
    re-reads of the config."""
    auth = BasicAuth()

    @web.middleware
    async def authenticated(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path in open_paths:
            return await handler(request)
        config = config_of()
        transport = request.transport
        peercert = transport.get_extra_info("peercert") if transport else None
        if not config.client_cert_allowed(peercert):
            return web.Response(status=403, text="client certificate not allowed\n")
        try:
            allowed = await auth.check_async(config, request.headers.get("Authorization"))
        except AuthBusy:
            return web.Response(status=503, text="too many password checks in progress; "
                                "retry in a second\n", headers={"Retry-After": "1"})
        if not allowed:
            return web.Response(status=401, text="Unauthorized\n",
                                headers={"WWW-Authenticate": f'Basic realm="{realm}"'})
        response = await handler(request)
        response.headers.update(config.headers)
        return response

    return authenticated
