"""A real Prometheus scraping an agent on a simulated node, and slurm-gpu-proxy in front
of it, for the proxy's tests and benchmark. Users (bcrypt, cost 4 to start fast):
alice, bob, carol (coordinator of account ml: carol, dave) and root (admin)."""

from __future__ import annotations

import base64
import json
import secrets
import sys
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import bcrypt
import yaml

from tests.support import free_port
from tests.support.agent import Agent
from tests.support.daemons import DEPLOY, Daemon, Prometheus
from tests.support.rig import Rig, Scrape

RULES = DEPLOY / "prometheus" / "rules" / "slurm-gpu-exporter.rules.yml"
CLUSTER = "testcluster"
USERS = ("alice", "bob", "carol", "root")
PUBLIC = ("cluster:slurm_gpus:count", "cluster:slurm_job_gpu_allocated_seconds:rate5m")
USER_HEADER = "X-Grafana-User"
SECRET_HEADER = "X-Slurm-Gpu-Proxy-Secret"


def password(user: str) -> str:
    return f"{user}-password"


def basic(user: str, secret: str | None = None) -> dict[str, str]:
    token = base64.b64encode(f"{user}:{secret or password(user)}".encode()).decode()
    return {"Authorization": f"Basic {token}"}


@dataclass
class Answer:
    status: int
    body: Any
    text: str


def request(url: str, headers: dict[str, str] | None = None,
            data: bytes | None = None, method: str | None = None,
            content_type: str = "application/x-www-form-urlencoded") -> Answer:
    headers = dict(headers or {})
    if data is not None:
        headers.setdefault("Content-Type", content_type)
    req = urllib.request.Request(url, data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            status, raw = resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        status, raw = exc.code, exc.read()
    text = raw.decode(errors="replace")
    try:
        body = json.loads(text)
    except ValueError:
        body = None
    return Answer(status, body, text)


@dataclass
class Client:
    """The Prometheus API at ``url`` as one caller: the interface tests.system.observe.grafana
    drives (query, query_range, label_values)."""

    url: str
    headers: dict[str, str] = field(default_factory=dict)

    def get(self, path: str, params: list[tuple[str, str]] | None = None) -> Answer:
        query = "?" + urllib.parse.urlencode(params) if params else ""
        return request(self.url + path + query, self.headers)

    def post(self, path: str, params: list[tuple[str, str]]) -> Answer:
        return request(self.url + path, self.headers, urllib.parse.urlencode(params).encode())

    def query(self, expr: str, at: float | None = None) -> dict:
        params = [("query", expr)] + ([("time", f"{at:.3f}")] if at is not None else [])
        return self.post("/api/v1/query", params).body

    def query_range(self, expr: str, start: float, end: float, step: float = 1) -> dict:
        return self.post("/api/v1/query_range", [
            ("query", expr), ("start", f"{start:.3f}"), ("end", f"{end:.3f}"),
            ("step", str(step))]).body

    def label_values(self, label: str, match: str | None = None) -> list[str]:
        answer = self.get(f"/api/v1/label/{label}/values",
                          [("match[]", match)] if match else None)
        assert answer.status == 200 and answer.body["status"] == "success", answer.text
        return answer.body["data"]


@dataclass
class ProxyStack:
    rig: Rig
    proxy: Daemon
    secret: str
    direct: Client

    @property
    def agent(self) -> Agent:
        return self.rig.agent

    @property
    def prometheus(self) -> Prometheus:
        return self.rig.prom

    def as_user(self, user: str) -> Client:
        return Client(self.proxy.url, basic(user))

    def via_grafana(self, user: str) -> Client:
        return Client(self.proxy.url, {USER_HEADER: user, SECRET_HEADER: self.secret})

    def stop(self) -> None:
        self.proxy.stop()
        self.rig.stop()


def simulated_rig(base: Path) -> Rig:
    """An agent on a simulated node, and a Prometheus that scrapes it every second as
    cluster CLUSTER and runs the shipped rules; ready."""
    return Rig(base, simulate=True, rule_files=[RULES], scrape=Scrape(
        "slurm-gpu-exporter", {"cluster": CLUSTER}, timeout="1s"))


def write_configs(base: Path, users: tuple[str, ...] = USERS) -> tuple[Path, Path, str]:
    """(web config, proxy config, shared secret) in ``base``."""
    hashes = {u: bcrypt.hashpw(password(u).encode(), bcrypt.gensalt(4)).decode() for u in users}
    web = base / "web.yml"
    web.write_text(yaml.safe_dump({"basic_auth_users": hashes}))
    secret = secrets.token_hex(24)
    (base / "grafana.secret").write_text(secret + "\n")
    proxy = base / "proxy.yml"
    proxy.write_text(yaml.safe_dump({
        "public_metrics": list(PUBLIC),
        "account_users": {"ml": ["carol", "dave"]},
        "coordinators": {"carol": ["ml"]},
        "user_header": {"name": USER_HEADER, "secret_header": SECRET_HEADER,
                        "secret_file": "grafana.secret"},
    }))
    return web, proxy, secret


def start(base: Path, users: tuple[str, ...] = USERS) -> ProxyStack:
    """Start everything (ended by PID through ``stop``); wait until each is ready."""
    base.mkdir(parents=True, exist_ok=True)
    web, proxy_config, secret = write_configs(base, users)
    rig = simulated_rig(base)
    proxy = None
    try:
        port = free_port()
        proxy = Daemon("proxy", [
            str(Path(sys.executable).parent / "slurm-gpu-proxy"),
            "--prometheus-url", rig.prom.url, "--web.listen-address", f"127.0.0.1:{port}",
            "--web.config.file", str(web), "--config", str(proxy_config), "--admin", "root",
        ], port, base)
        proxy.wait_ready()
    except BaseException:
        if proxy is not None:
            proxy.stop()
        rig.stop()
        raise
    return ProxyStack(rig, proxy, secret, Client(rig.prom.url))
