"""What the proxy's handlers share: the app's state (``request.app[STATE]``), what the
authentication middleware leaves on a request, and ``Refused``, the one way a handler
says no."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from yarl import URL

from slurm_gpu_exporter.proxy.archive import ArchiveReader
from slurm_gpu_exporter.proxy.config import ProxyConfig
from slurm_gpu_exporter.proxy.fairness import Backoff, PerUser
from slurm_gpu_exporter.proxy.identity import Caller
from slurm_gpu_exporter.proxy.munge import MungeDecoder
from slurm_gpu_exporter.proxy.observe import ProxyMetrics
from slurm_gpu_exporter.proxy.query.check_pool import CheckPool
from slurm_gpu_exporter.proxy.query.restrict import Scope
from slurm_gpu_exporter.proxy.upstream import Upstream
from slurm_gpu_exporter.web.basic_auth import BasicAuth
from slurm_gpu_exporter.web.config import WebConfig

# What a 503 (too busy: password checks or query checks) tells the client to wait.
RETRY_AFTER_S = 1
# Keys of what the authentication middleware leaves on a request (typed keys where
# aiohttp has them, 3.13 on).
_RequestKey = getattr(web, "RequestKey", None)
CALLER: Any = _RequestKey("caller", Caller) if _RequestKey else "slurm_gpu_proxy.caller"
SCOPE: Any = _RequestKey("scope", Scope) if _RequestKey else "slurm_gpu_proxy.scope"


@dataclass
class ProxyState:
    """One proxy's settings and shared parts, made by ``app.make_app``.

    Queries are checked in the worker processes of ``checks``, admins' in those of
    ``admin_checks``; ``check_share`` and ``backoff`` are each user's share of the
    checkers and the growing wait of one whose queries keep being killed for time
    (fairness.py); ``upstream_calls`` the store's connection pools (upstream.py)."""

    config: ProxyConfig
    web_config: WebConfig
    metrics: ProxyMetrics
    checks: CheckPool
    admin_checks: CheckPool
    check_share: PerUser
    backoff: Backoff
    upstream_calls: Upstream
    read_timeout: float
    munge: MungeDecoder | None = None
    archive: ArchiveReader | None = None
    # The basic-auth checks against web_config and what they keep (web/basic_auth.py).
    basic_auth: BasicAuth = field(default_factory=BasicAuth)
    upstream: URL = field(init=False)  # the store's base URL

    def __post_init__(self) -> None:
        self.upstream = URL(self.config.prometheus_url)


STATE = web.AppKey("proxy_state", ProxyState)


class Refused(Exception):
    def __init__(self, status: int, reason: str, message: str,
                 retry_after: int = RETRY_AFTER_S) -> None:
        super().__init__(message)
        self.status, self.reason, self.message = status, reason, message
        self.retry_after = retry_after

