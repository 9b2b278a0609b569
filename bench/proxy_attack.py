"""slurm-gpu-proxy under issue 33's attack: 20 users send a query that is slow to
parse while an admin queries; and the latency the proxy adds to normal queries. With
``--attack`` one of issue 45's (``slow-parse-user``, ``slow-parse-nocount``,
``idle-hold``, ``slow-upstream``: bench/proxy_fairness.py), one user attacks while
another user and an admin query; their answers and p50/p99.

Starts Debian's Prometheus scraping the agent on a simulated node and the proxy in
front of it (tests/proxy/stack.py), all on 127.0.0.1. Then:

1. for ``--seconds``, ``--users`` attackers (Grafana's trusted header, a name each)
   POST the attack query in a loop, while an admin (basic auth) runs
   ``count(slurm_job_info)`` back to back: the admin's latency (p50, p99, max), the
   attackers' answers by HTTP status;
2. without the attack, the user and job dashboards' queries directly and through the
   proxy, paired (bench/proxy.py's measure): the added latency at p50.

``--attack comment-hidden`` is the issue's query (``# "``, 8,000 nested parentheses,
``# "``: the parser takes over 30 s); ``slow-parse`` is one inside every limit on the
text whose regexes the parser compiles for seconds. Every loop is bounded in count and
in time; a request that gets no answer in ``--timeout`` seconds counts as one that
took that long.

    .venv/bin/python bench/proxy_attack.py [--attack comment-hidden] [--users 20]
        [--seconds 20] [--rounds 10] [--tag before|after]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import percentile, record
from bench.proxy import added_latency, dashboard_queries
from bench.proxy_fairness import run_attack
from tests.proxy.stack import SECRET_HEADER, USER_HEADER, ProxyStack, basic
from tests.proxy.stack import start as start_stack

ATTACKS = {
    "comment-hidden": '# "\n' + "(" * 8000 + "1" + ")" * 8000 + '\n# "',
    "slow-parse": " or ".join(f'x{{a=~"(.{{0,1000}}){{0,{1000 + i}}}"}}' for i in range(30)),
}
FAIRNESS_ATTACKS = ("slow-parse-user", "slow-parse-nocount", "idle-hold", "slow-upstream")
MAX_REQUESTS_EACH = 2000
ADMIN_PAUSE_S = 0.02


async def under_attack(stack: ProxyStack, attack: str, users: int, seconds: float,
                       timeout: float) -> dict:
    url = f"{stack.proxy.url}/api/v1/query"
    deadline = time.monotonic() + seconds
    statuses: collections.Counter[str] = collections.Counter()
    attack_times: list[float] = []
    admin_times: list[float] = []
    admin_failures: list[str] = []

    async def attacker(session: aiohttp.ClientSession, i: int) -> None:
        headers = {USER_HEADER: f"user{i:02d}", SECRET_HEADER: stack.secret}
        for _ in range(MAX_REQUESTS_EACH):
            if time.monotonic() > deadline:
                return
            started = time.perf_counter()
            try:
                async with session.post(url, data={"query": attack}, headers=headers,
                                        timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
                    await resp.read()
                    statuses[str(resp.status)] += 1
            except (TimeoutError, aiohttp.ClientError) as exc:
                statuses[type(exc).__name__] += 1
            attack_times.append(time.perf_counter() - started)

    async def admin(session: aiohttp.ClientSession) -> None:
        await asyncio.sleep(0.5)  # the attackers' first queries are in
        for _ in range(MAX_REQUESTS_EACH):
            if time.monotonic() > deadline:
                return
            started = time.perf_counter()
            try:
                async with session.post(url, data={"query": "count(slurm_job_info)"},
                                        headers=basic("root"),
                                        timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
                    body = await resp.json()
                    if resp.status != 200 or not body["data"]["result"]:
                        admin_failures.append(f"HTTP {resp.status}")
            except (TimeoutError, aiohttp.ClientError) as exc:
                admin_failures.append(type(exc).__name__)
            admin_times.append(time.perf_counter() - started)
            await asyncio.sleep(ADMIN_PAUSE_S)

    connector = aiohttp.TCPConnector(limit=users + 1)
    async with aiohttp.ClientSession(connector=connector) as session:
        started = time.monotonic()
        await asyncio.gather(admin(session), *(attacker(session, i) for i in range(users)))
        wall = time.monotonic() - started
    return {"attack_users": users, "attack_seconds": round(wall, 1),
            "attack_answers": dict(sorted(statuses.items())),
            "attack_ms_p50": round(percentile(attack_times, 50) * 1e3, 2),
            "admin_requests": len(admin_times), "admin_failures": len(admin_failures),
            "admin_first_failure": admin_failures[0] if admin_failures else "",
            "admin_ms_p50": round(percentile(admin_times, 50) * 1e3, 2),
            "admin_ms_p99": round(percentile(admin_times, 99) * 1e3, 2),
            "admin_ms_max": round(max(admin_times) * 1e3, 2)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--attack", choices=sorted(ATTACKS) + list(FAIRNESS_ATTACKS),
                        default="comment-hidden")
    parser.add_argument("--users", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--timeout", type=float, default=30.0)
    parser.add_argument("--rounds", type=int, default=10,
                        help="rounds of the dashboards' queries for the added latency (0: skip)")
    parser.add_argument("--tag", default="", help="suffix of the results file (before/after)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-proxy-attack-") as tmp:
        stack = start_stack(Path(tmp))
        try:
            deadline = time.monotonic() + 60
            while not stack.prometheus.query(
                    'user:slurm_job_gpu_busy:ratio_rate5m{user="alice"}')["data"]["result"]:
                if time.monotonic() > deadline:
                    raise TimeoutError("no recorded series after 60 s")
                time.sleep(0.5)
            figures: dict[str, object] = {"attack": args.attack, "budget_admin_ms_p99": 1000,
                                          "budget_added_ms_p50": 2,
                                          "load_average_1m_before": round(os.getloadavg()[0], 2)}
            if args.rounds:
                end = time.time()
                jobid = stack.prometheus.vector(
                    'slurm_job_info{user="alice"}')[0]["metric"]["jobid"]
                figures.update(added_latency(stack, dashboard_queries("alice", jobid, end),
                                             args.rounds))
            if args.attack in FAIRNESS_ATTACKS:
                figures.update(run_attack(stack, args.attack, args.seconds, args.timeout,
                                          Path(tmp)))
            else:
                figures.update(asyncio.run(under_attack(stack, ATTACKS[args.attack],
                                                        args.users, args.seconds,
                                                        args.timeout)))
            figures["load_average_1m_after"] = round(os.getloadavg()[0], 2)
        finally:
            stack.stop()
    name = "proxy_attack_" + args.attack.replace("-", "_")
    record(name + (f"_{args.tag}" if args.tag else ""), figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
