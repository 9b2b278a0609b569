"""Edges of the proxy's rules in process: each user's share of the query checkers
(busy, struck while holding it, other users unaffected), the state make_app builds,
client certificates (the web config's allowed SANs, a user header proven by one) and
the config's bounds."""

from __future__ import annotations

import asyncio
from pathlib import Path
from unittest import mock

import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from slurm_gpu_exporter.proxy.api import api
from slurm_gpu_exporter.proxy.app import make_app
from slurm_gpu_exporter.proxy.config import ConfigError, ProxyConfig, UserHeader, parse_config
from slurm_gpu_exporter.proxy.fairness import Backoff, FairLimits, PerUser
from slurm_gpu_exporter.proxy.identity import Caller, Refusal, identify
from slurm_gpu_exporter.proxy.query.restrict import Scope
from slurm_gpu_exporter.proxy.state import CALLER, SCOPE, STATE, Refused
from slurm_gpu_exporter.web.basic_auth import BasicAuth
from slurm_gpu_exporter.web.config import TlsSettings, WebConfig
from tests.proxy.test_read_endpoints import Checks, State


class HeldChecks(Checks):
    """Checks that hold a ``slow`` query until ``opened``."""

    def __init__(self) -> None:
        super().__init__()
        self.opened = asyncio.Event()
        self.entered = asyncio.Event()

    async def check(self, kind: str, text: str, scope: Scope) -> str:
        if text == "slow":
            self.entered.set()
            await self.opened.wait()
        return await super().check(kind, text, scope)


def _request(app: web.Application, user: str, query: str) -> web.Request:
    r = make_mocked_request("GET", f"/api/v1/query?query={query}", app=app)
    r[SCOPE] = Scope(admin=False, users=frozenset({user}))
    r[CALLER] = Caller(user, "basic")
    return r


def _with_alice_holding_her_share(then: str, user: str = "alice",
                                  strike: bool = False) -> object:
    """Alice's slow query holds her one check slot (none may wait) while ``user`` asks
    ``then``; what that second request gets."""
    async def run() -> object:
        state = State(checks=HeldChecks(),
                      check_share=PerUser("queries being checked", 1, 0, 1.0))
        app = web.Application()
        app[STATE] = state  # type: ignore[assignment]
        first = asyncio.create_task(api(_request(app, "alice", "slow")))
        await state.checks.entered.wait()  # type: ignore[attr-defined]
        if strike:
            state.backoff.strike("alice")
        try:
            return await api(_request(app, user, then))
        except Refused as exc:
            return exc
        finally:
            state.checks.opened.set()  # type: ignore[attr-defined]
            await first
    return asyncio.run(run())


def test_a_user_whose_share_is_taken_gets_503_with_the_wait() -> None:
    got = _with_alice_holding_her_share("up")
    assert isinstance(got, Refused)
    assert (got.status, got.reason, got.retry_after) == (503, "busy", 1)
    assert got.message == ("you have 1 queries being checked in progress and 0 waiting, "
                           "the most one user may; retry in 1 s")


def test_another_user_is_not_held_up_by_a_full_share() -> None:
    assert isinstance(_with_alice_holding_her_share("up", user="bob"), web.Response)


def test_a_struck_user_is_told_to_back_off_before_taking_a_share() -> None:
    got = _with_alice_holding_her_share("up", strike=True)
    assert isinstance(got, Refused) and (got.status, got.reason) == (429, "backoff")


def test_make_app_builds_the_state_from_the_config_and_limits() -> None:
    archive = object()
    limits = FairLimits(checks_per_user=3, backoff_first_seconds=2.0,
                        backoff_max_seconds=9.0, backoff_forget_seconds=50.0)
    app = make_app(ProxyConfig("http://store:9090/prom"), archive=archive,  # type: ignore
                   limits=limits, read_timeout=7.0)
    state = app[STATE]
    assert state.archive is archive and state.read_timeout == 7.0
    assert str(state.upstream) == "http://store:9090/prom"
    assert state.upstream_calls.url == "http://store:9090/prom"
    assert isinstance(state.backoff, Backoff)
    assert (state.backoff.first, state.backoff.longest, state.backoff.forget) == (
        2.0, 9.0, 50.0)
    assert (state.check_share.what, state.check_share.limit) == ("queries being checked", 3)
    assert state.upstream_calls.limits is limits


def _cert_request(headers: dict[str, str], sans: tuple[str, ...]) -> web.Request:
    transport = mock.Mock()
    transport.get_extra_info.side_effect = lambda name, default=None: (
        {"subjectAltName": tuple(("DNS", s) for s in sans)} if name == "peercert" else default)
    return make_mocked_request("GET", "/api/v1/query", headers=headers, transport=transport)


TLS = TlsSettings(Path("/c.pem"), Path("/k.pem"), client_allowed_sans=("grafana.example",))


def _who(request: web.Request, config: WebConfig,
         header: UserHeader | None = None) -> Caller | Refusal:
    return asyncio.run(identify(request, config, header, auth=BasicAuth()))


def test_a_client_certificate_without_an_allowed_san_is_403() -> None:
    config = WebConfig(tls=TLS)
    assert _who(_cert_request({}, ("laptop.example",)), config) == Refusal(
        403, "client_cert", "client certificate not allowed; use one with an allowed "
        "subjectAltName")
    # an allowed one goes on to the next question: who it is
    assert _who(_cert_request({}, ("grafana.example",)), config) == Refusal(
        401, "unauthenticated", "authentication required: the user header from a client "
        "that proves itself")


def test_a_user_header_is_believed_from_a_client_certificate_it_names() -> None:
    header = UserHeader("X-Grafana-User", client_cert_sans=("grafana.example",))
    assert _who(_cert_request({"X-Grafana-User": "bob"}, ("grafana.example",)),
                WebConfig(), header) == Caller("bob", "header")
    assert _who(_cert_request({"X-Grafana-User": "bob"}, ("other.example",)),
                WebConfig(), header).reason == "forged_user_header"  # type: ignore[union-attr]


def test_the_config_bounds(tmp_path: Path) -> None:
    (tmp_path / "s16").write_text("0123456789abcdef")
    (tmp_path / "s15").write_text("0123456789abcde")
    ok = parse_config({"user_header": {"name": "X-U", "secret_header": "X-S",
                                       "secret_file": "s16",
                                       "client_cert_sans": ["grafana.example"]}}, tmp_path)
    assert ok["user_header"] == UserHeader("X-U", "X-S", b"0123456789abcdef",
                                           ("grafana.example",))
    with pytest.raises(ConfigError) as short:
        parse_config({"user_header": {"name": "X-U", "secret_header": "X-S",
                                      "secret_file": "s15"}}, tmp_path)
    assert str(short.value) == (f"user_header.secret_file {tmp_path / 's15'} holds fewer "
                                "than 16 bytes; use a long random secret (openssl rand -hex 32)")
    with pytest.raises(ConfigError) as mapping:
        parse_config({"user_header": "X-U"}, tmp_path)
    assert str(mapping.value) == "user_header must be a mapping"
    for timeout in (0, -1, "5"):
        with pytest.raises(ConfigError) as bad:
            parse_config({"upstream_timeout_seconds": timeout}, tmp_path)
        assert str(bad.value) == "upstream_timeout_seconds must be a positive number"
    assert parse_config({"upstream_timeout_seconds": 0.5}, tmp_path)[
        "upstream_timeout"] == 0.5
