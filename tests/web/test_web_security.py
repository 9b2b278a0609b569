"""TLS, client certificates and basic auth on the real agent, over real sockets."""

from __future__ import annotations

import base64
import http.client
import shutil
import ssl
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import bcrypt
import pytest

from tests.support import require, wait_until
from tests.support.agent import Agent

pytestmark = pytest.mark.process


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    require(shutil.which("openssl") is not None, "openssl is not installed")
    d = tmp_path_factory.mktemp("pki")
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=ca",
             "-keyout", "ca.key", "-out", "ca.crt", cwd=d)
    for name, ext in (("server", "subjectAltName=IP:127.0.0.1"),
                      ("client", "subjectAltName=DNS:prometheus.example")):
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}",
                 "-keyout", f"{name}.key", "-out", f"{name}.csr", cwd=d)
        (d / f"{name}.ext").write_text(ext + "\n")
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
                 "-CAcreateserial", "-days", "2", "-extfile", f"{name}.ext",
                 "-out", f"{name}.crt", cwd=d)
    return d


def _get(url: str, ctx: ssl.SSLContext | None, auth: str | None = None) -> int:
    headers = {"Authorization": auth} if auth else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers),
                                    context=ctx, timeout=5) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


def _wait_ready(agent: Agent, ctx: ssl.SSLContext, auth: str | None = None) -> None:
    def ready() -> bool:
        try:
            return _get(agent.url + "/-/ready", ctx, auth) == 200
        except urllib.error.URLError:
            return False

    wait_until(ready, 20, "the agent to be ready over TLS", poll=0.1, log=agent.log)


def _start(tmp_path: Path, config: str) -> Agent:
    web = tmp_path / "web.yml"
    web.write_text(config)
    agent = Agent(["--simulate", "--web.config.file", str(web)], log_path=tmp_path / "log")
    agent.url = agent.url.replace("http://", "https://")
    return agent


def _client_ctx(pki: Path, with_cert: bool) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    if with_cert:
        ctx.load_cert_chain(pki / "client.crt", pki / "client.key")
    return ctx


def test_tls_with_basic_auth_refuses_wrong_credentials(pki: Path, tmp_path: Path) -> None:
    hashed = bcrypt.hashpw(b"pw", bcrypt.gensalt(rounds=4)).decode()
    agent = _start(tmp_path, f"tls_server_config:\n  cert_file: {pki}/server.crt\n"
                             f"  key_file: {pki}/server.key\n"
                             f"basic_auth_users:\n  prom: '{hashed}'\n")
    try:
        ctx = _client_ctx(pki, with_cert=False)
        good = "Basic " + base64.b64encode(b"prom:pw").decode()
        bad = "Basic " + base64.b64encode(b"prom:nope").decode()
        _wait_ready(agent, ctx, good)
        assert _get(agent.url + "/metrics", ctx, good) == 200
        assert _get(agent.url + "/metrics", ctx, bad) == 401
        assert _get(agent.url + "/metrics", ctx) == 401
        with pytest.raises((OSError, http.client.HTTPException)):  # plain HTTP gets no answer
            _get(agent.url.replace("https://", "http://") + "/metrics", None, good)
    finally:
        agent.stop()


def test_client_certificate_is_required_and_its_san_checked(pki: Path, tmp_path: Path) -> None:
    agent = _start(tmp_path, f"tls_server_config:\n  cert_file: {pki}/server.crt\n"
                             f"  key_file: {pki}/server.key\n"
                             "  client_auth_type: RequireAndVerifyClientCert\n"
                             f"  client_ca_file: {pki}/ca.crt\n"
                             "  client_allowed_sans: [prometheus.example]\n")
    try:
        ctx = _client_ctx(pki, with_cert=True)
        _wait_ready(agent, ctx)
        assert _get(agent.url + "/metrics", ctx) == 200
        with pytest.raises((OSError, http.client.HTTPException)):
            _get(agent.url + "/metrics", _client_ctx(pki, with_cert=False))
    finally:
        agent.stop()


def test_agent_refuses_to_start_with_an_invalid_web_config(tmp_path: Path) -> None:
    agent = _start(tmp_path, "tls_server_config:\n  cert_file: only-cert.crt\n")
    assert agent.proc.wait(20) == 2
    assert "needs both cert_file and key_file" in agent.log()
