"""slurm-gpu-proxy: latency it adds over Prometheus, and 200 concurrent users.

Starts Debian's Prometheus scraping the agent on a simulated node, and the proxy in
front of it (tests/proxy/stack.py), all on 127.0.0.1. Then:

1. the enforcement alone, in process: parse, restrict, print and check each query;
2. every query of the user and job dashboards (alice's user and one of her jobs), run
   in turn directly and through the proxy as alice (basic auth) and as an admin, over
   kept-alive connections; added latency = proxy - direct for each pair;
3. 200 concurrent users for 20 s (Grafana's trusted header, the simulated users' names
   in turn), each running the user dashboard's queries for their own user in a loop:
   errors, requests per second, latency.

Every loop is bounded in count and in time.

    .venv/bin/python bench/proxy.py [--rounds 30] [--users 200] [--seconds 20]
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import os
import sys
import tempfile
import time
import urllib.parse
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import percentile, record
from slurm_gpu_exporter.proxy.query.restrict import Scope, restrict_query
from tests.proxy.stack import CLUSTER, PUBLIC, SECRET_HEADER, USER_HEADER, ProxyStack, basic
from tests.proxy.stack import start as start_stack
from tests.support.daemons import DEPLOY
from tests.system.observe import grafana

SIM_USERS = ("alice", "bob", "carol", "dave")
MAX_REQUESTS_PER_USER = 5000


def dashboard_queries(user: str, jobid: str, end: float,
                      boards: tuple[str, ...] = ("user", "job")
                      ) -> list[tuple[str, dict[str, str]]]:
    """(path, form) of every non-training query of these dashboards."""
    out = []
    values = {"cluster": CLUSTER, "user": user, "jobid": jobid}
    for name in (f"slurm-gpu-{board}.json" for board in boards):
        for target in grafana.targets(grafana.load(DEPLOY / "grafana" / "dashboards" / name)):
            if grafana.TRAINING in target.expr:
                continue
            expr = grafana.fill(target.expr, values, 3600)
            if target.instant:
                out.append(("/api/v1/query", {"query": expr, "time": f"{end:.3f}"}))
            else:
                out.append(("/api/v1/query_range", {"query": expr, "start": f"{end - 3600:.3f}",
                                                    "end": f"{end:.3f}", "step": "15"}))
    return out


def timed_post(conn: http.client.HTTPConnection, path: str, form: dict[str, str],
               headers: dict[str, str]) -> float:
    body = urllib.parse.urlencode(form)
    started = time.perf_counter()
    conn.request("POST", path, body, {**headers,
                                      "Content-Type": "application/x-www-form-urlencoded"})
    resp = conn.getresponse()
    resp.read()
    elapsed = time.perf_counter() - started
    if resp.status != 200:
        raise RuntimeError(f"{path} {form['query']!r}: HTTP {resp.status}")
    return elapsed


def enforcement_cost(queries: list[tuple[str, dict[str, str]]], rounds: int) -> dict:
    scope = Scope(admin=False, users=frozenset({"alice"}), public=frozenset(PUBLIC))
    times = []
    for _ in range(rounds):
        for _, form in queries:
            started = time.perf_counter()
            restrict_query(form["query"], scope)
            times.append(time.perf_counter() - started)
    return {"enforce_only_ms_p50": round(percentile(times, 50) * 1e3, 3),
            "enforce_only_ms_p99": round(percentile(times, 99) * 1e3, 3)}


def added_latency(stack: ProxyStack, queries: list[tuple[str, dict[str, str]]],
                  rounds: int) -> dict:
    def connect(url: str) -> http.client.HTTPConnection:
        host, port = url.removeprefix("http://").split(":")
        return http.client.HTTPConnection(host, int(port), timeout=30)

    direct, proxy = connect(stack.prometheus.url), connect(stack.proxy.url)
    figures: dict[str, object] = {"queries_per_round": len(queries), "rounds": rounds}
    for who in ("alice", "root"):
        base, through, added = [], [], []
        headers = basic(who)
        for _ in range(rounds):
            for path, form in queries:
                d = timed_post(direct, path, form, {})
                p = timed_post(proxy, path, form, headers)
                base.append(d)
                through.append(p)
                added.append(p - d)
        role = "user" if who == "alice" else "admin"
        figures.update({
            f"{role}_direct_ms_p50": round(percentile(base, 50) * 1e3, 2),
            f"{role}_proxy_ms_p50": round(percentile(through, 50) * 1e3, 2),
            f"{role}_added_ms_p50": round(percentile(added, 50) * 1e3, 2),
            f"{role}_added_ms_p99": round(percentile(added, 99) * 1e3, 2),
        })
    direct.close()
    proxy.close()
    return figures


async def concurrent_users(stack: ProxyStack, users: int, seconds: float, jobid: str,
                           end: float) -> dict:
    latencies: list[float] = []
    errors: list[str] = []
    deadline = time.monotonic() + seconds
    per_user = {u: dashboard_queries(u, jobid, end, ("user",)) for u in SIM_USERS}

    async def one(session: aiohttp.ClientSession, i: int) -> None:
        name = SIM_USERS[i % len(SIM_USERS)]
        headers = {USER_HEADER: name, SECRET_HEADER: stack.secret}
        queries = per_user[name]
        for n in range(MAX_REQUESTS_PER_USER):
            if time.monotonic() > deadline:
                return
            path, form = queries[n % len(queries)]
            started = time.perf_counter()
            try:
                async with session.post(stack.proxy.url + path, data=form,
                                        headers=headers) as resp:
                    body = await resp.json()
                    if resp.status != 200 or body.get("status") != "success":
                        errors.append(f"HTTP {resp.status}: {body.get('error')}")
            except (TimeoutError, aiohttp.ClientError) as exc:
                errors.append(repr(exc))
            latencies.append(time.perf_counter() - started)

    connector = aiohttp.TCPConnector(limit=users)
    async with aiohttp.ClientSession(connector=connector,
                                     timeout=aiohttp.ClientTimeout(total=60)) as session:
        started = time.monotonic()
        await asyncio.gather(*(one(session, i) for i in range(users)))
        wall = time.monotonic() - started
    return {"concurrent_users": users, "concurrent_seconds": round(wall, 1),
            "concurrent_requests": len(latencies), "concurrent_errors": len(errors),
            "concurrent_first_error": errors[0] if errors else "",
            "concurrent_requests_per_s": round(len(latencies) / wall, 1),
            "concurrent_ms_p50": round(percentile(latencies, 50) * 1e3, 1),
            "concurrent_ms_p99": round(percentile(latencies, 99) * 1e3, 1)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--users", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=20.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-proxy-") as tmp:
        stack = start_stack(Path(tmp))
        try:
            deadline = time.monotonic() + 60
            while not stack.prometheus.query(
                    'user:slurm_job_gpu_busy:ratio_rate5m{user="alice"}')["data"]["result"]:
                if time.monotonic() > deadline:
                    raise TimeoutError("no recorded series after 60 s")
                time.sleep(0.5)
            end = time.time()
            jobid = stack.prometheus.vector('slurm_job_info{user="alice"}')[0]["metric"]["jobid"]
            queries = dashboard_queries("alice", jobid, end)
            figures = {"budget_added_ms_p50": 2,
                       "load_average_1m_before": round(os.getloadavg()[0], 2),
                       **enforcement_cost(queries, args.rounds),
                       **added_latency(stack, queries, args.rounds),
                       **asyncio.run(concurrent_users(stack, args.users, args.seconds, jobid,
                                                      end)),
                       "load_average_1m_after": round(os.getloadavg()[0], 2)}
        finally:
            stack.stop()
    record("proxy", figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
