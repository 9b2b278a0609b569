"""The web config on the real agent: min_version enforced, and re-read without a restart."""

from __future__ import annotations

import http.client
import os
import signal
import ssl
import time
import urllib.error
from collections.abc import Callable
from pathlib import Path

import bcrypt
import pytest

from tests.support import basic_auth, wait_until
from tests.support.agent import Agent
from tests.web.test_web_security import _client_ctx, _get, _wait_ready, pki

pytestmark = pytest.mark.process

__all__ = ["pki"]  # the module-scoped certificate fixture, shared with test_web_security


def _tls(pki: Path, extra: str = "") -> str:
    return (f"tls_server_config:\n  cert_file: {pki}/server.crt\n"
            f"  key_file: {pki}/server.key\n{extra}")


def _users(password: str) -> str:
    hashed = bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=4)).decode()
    return f"basic_auth_users:\n  prom: '{hashed}'\n"


def _replace(path: Path, text: str) -> None:
    """Write a new version the way config management does: a new file renamed into place."""
    tmp = path.with_suffix(".new")
    tmp.write_text(text)
    os.replace(tmp, path)


def _until(condition: Callable[[], bool], agent: Agent, timeout: float = 15.0) -> None:
    wait_until(condition, timeout, f"{condition}", log=agent.log)


def _start(tmp_path: Path, config: str, *extra: str) -> tuple[Agent, Path]:
    web = tmp_path / "web.yml"
    web.write_text(config)
    agent = Agent(["--simulate", "--web.config.file", str(web), *extra],
                  log_path=tmp_path / "log")
    agent.url = agent.url.replace("http://", "https://")
    return agent, web


def test_min_version_is_enforced(pki: Path, tmp_path: Path) -> None:
    agent, _ = _start(tmp_path, _tls(pki, "  min_version: TLS13\n"))
    try:
        ctx = _client_ctx(pki, with_cert=False)
        _wait_ready(agent, ctx)
        old = _client_ctx(pki, with_cert=False)
        old.maximum_version = ssl.TLSVersion.TLSv1_2
        with pytest.raises((OSError, http.client.HTTPException)):
            _get(agent.url + "/metrics", old)
        assert _get(agent.url + "/metrics", ctx) == 200
    finally:
        agent.stop()


def test_sighup_rereads_the_password_and_a_broken_file_keeps_the_last_good(
        pki: Path, tmp_path: Path) -> None:
    agent, web = _start(tmp_path, _tls(pki) + _users("first"),
                        "--web.config.reload-interval", "3600")
    try:
        ctx = _client_ctx(pki, with_cert=False)
        _wait_ready(agent, ctx, basic_auth("prom", "first"))
        assert _get(agent.url + "/metrics", ctx, basic_auth("prom", "second")) == 401

        _replace(web, _tls(pki) + _users("second"))
        agent.proc.send_signal(signal.SIGHUP)
        second = basic_auth("prom", "second")
        _until(lambda: _get(agent.url + "/metrics", ctx, second) == 200, agent)
        assert _get(agent.url + "/metrics", ctx, basic_auth("prom", "first")) == 401

        _replace(web, "basic_auth_users: [not, a, mapping\n")
        for _ in range(3):  # one log line for this broken version, however often it is checked
            agent.proc.send_signal(signal.SIGHUP)
        _until(lambda: "not re-read" in agent.log(), agent)
        time.sleep(0.5)
        assert agent.log().count("not re-read") == 1
        assert _get(agent.url + "/metrics", ctx, basic_auth("prom", "second")) == 200
        assert agent.proc.poll() is None
    finally:
        agent.stop()


def test_a_changed_file_is_seen_without_a_signal_and_tls_settings_follow(
        pki: Path, tmp_path: Path) -> None:
    agent, web = _start(tmp_path, _tls(pki), "--web.config.reload-interval", "0.2")
    try:
        ctx = _client_ctx(pki, with_cert=False)
        _wait_ready(agent, ctx)
        _replace(web, _tls(pki, "  client_auth_type: RequireAndVerifyClientCert\n"
                                f"  client_ca_file: {pki}/ca.crt\n"))

        def refused_without_cert() -> bool:
            try:
                _get(agent.url + "/-/ready", ctx)
            except (OSError, http.client.HTTPException):
                return True
            return False

        _until(refused_without_cert, agent)
        assert _get(agent.url + "/metrics", _client_ctx(pki, with_cert=True)) == 200
        # Turning TLS off would change the listening socket: refused, TLS stays.
        _replace(web, "")
        _until(lambda: "needs a restart" in agent.log(), agent)
        assert _get(agent.url + "/metrics", _client_ctx(pki, with_cert=True)) == 200
    finally:
        agent.stop()


def test_plain_http_agent_rereads_basic_auth(tmp_path: Path) -> None:
    web = tmp_path / "web.yml"
    web.write_text("")
    agent = Agent(["--simulate", "--web.config.file", str(web),
                   "--web.config.reload-interval", "0.2"], log_path=tmp_path / "log")
    try:
        agent.wait_ready()
        _replace(web, _users("pw"))

        def locked() -> bool:
            try:
                return _get(agent.url + "/metrics", None) == 401
            except urllib.error.URLError:
                return False

        _until(locked, agent)
        assert _get(agent.url + "/metrics", None, basic_auth("prom", "pw")) == 200
    finally:
        agent.stop()
