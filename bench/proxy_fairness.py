"""Issue 45's attacks by one ordinary user on slurm-gpu-proxy (used by proxy_attack.py).

Each runs for a few seconds while another user (bob) and an admin (root) ask a small
query every 0.2 s, each on a fresh connection: their answers and latency (p50, p99).

- ``slow-parse-user``: alice keeps 8 queries in flight whose 20 regexes take the
  parser seconds (``l0=~"\\w{300}"``, 313 bytes);
- ``slow-parse-nocount``: the same with the regexes written out (``\\w`` 100 times
  each, no count for the text bound to see): what the per-user share and back-off
  catch;
- ``idle-hold``: sockets opened and held silent up to the proxy's connection cap
  (default 1,024), reopened as they are closed;
- ``slow-upstream``: alice keeps 70 queries in flight that the store holds 8 s each
  (tests/proxy/slow_store.py: a stand-in in front of the real Prometheus delays every
  query naming ``slow_metric``), through a second proxy in front of the stand-in.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import sys
import time
from pathlib import Path

import aiohttp

from bench.common import percentile
from tests.proxy.slow_store import slow_store
from tests.proxy.stack import ProxyStack, basic
from tests.support import free_port
from tests.support.daemons import Daemon

SLOW_REGEX_USER = "x{" + ",".join(f'l{i}=~"\\\\w{{300}}"' for i in range(20)) + "}"
SLOW_REGEX_NOCOUNT = "x{" + ",".join(f'l{i}=~"' + "\\\\w" * 100 + '"'
                                     for i in range(20)) + "}"
SLOW_UPSTREAM_QUERY = "sum(slow_metric)"
SLOW_UPSTREAM_S = 8.0
VICTIM_PAUSE_S = 0.2
HOLD_SOCKETS = 1100


async def _victims(url: str, deadline: float, timeout: float) -> dict:
    """bob's and root's answers until ``deadline``, a fresh connection each."""
    out: dict[str, object] = {}

    async def one(who: str, query: str) -> None:
        times: list[float] = []
        statuses: collections.Counter[str] = collections.Counter()
        await asyncio.sleep(0.5)  # the attack is under way
        while time.monotonic() < deadline:
            started = time.perf_counter()
            try:
                async with aiohttp.ClientSession() as session, session.post(
                        f"{url}/api/v1/query", data={"query": query}, headers=basic(who),
                        timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
                    await resp.read()
                    statuses[str(resp.status)] += 1
            except (TimeoutError, aiohttp.ClientError, OSError) as exc:
                statuses[type(exc).__name__] += 1
            times.append(time.perf_counter() - started)
            await asyncio.sleep(VICTIM_PAUSE_S)
        role = "admin" if who == "root" else "user"
        out[f"{role}_requests"] = len(times)
        out[f"{role}_answers"] = dict(sorted(statuses.items()))
        out[f"{role}_ms_p50"] = round(percentile(times, 50) * 1e3, 1) if times else None
        out[f"{role}_ms_p99"] = round(percentile(times, 99) * 1e3, 1) if times else None

    await asyncio.gather(one("bob", "count(up)"), one("root", "count(slurm_job_info)"))
    return out


async def _query_flood(url: str, query: str, in_flight: int, deadline: float,
                       timeout: float) -> collections.Counter[str]:
    statuses: collections.Counter[str] = collections.Counter()

    async def loop(session: aiohttp.ClientSession) -> None:
        while time.monotonic() < deadline:
            try:
                async with session.post(f"{url}/api/v1/query", data={"query": query},
                                        headers=basic("alice"),
                                        timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
                    await resp.read()
                    statuses[str(resp.status)] += 1
                    if resp.status in (429, 503):  # an attacker does not wait: again
                        await asyncio.sleep(0.01)
            except (TimeoutError, aiohttp.ClientError) as exc:
                statuses[type(exc).__name__] += 1

    async with aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=in_flight)) as session:
        await asyncio.gather(*(loop(session) for _ in range(in_flight)))
    return statuses


async def _hold_idle(port: int, deadline: float) -> dict:
    """Keep up to HOLD_SOCKETS silent connections open, reopening closed ones."""
    held: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    opened = 0
    while time.monotonic() < deadline:
        held = [(r, w) for r, w in held if not r.at_eof() and not w.is_closing()]
        while len(held) < HOLD_SOCKETS and time.monotonic() < deadline:
            try:
                held.append(await asyncio.open_connection("127.0.0.1", port))
                opened += 1
            except OSError:
                break
        await asyncio.sleep(0.2)  # closed ones are at EOF by then
    alive = len([1 for r, w in held if not r.at_eof()])
    for _, writer in held:
        writer.close()
    return {"idle_sockets_opened": opened, "idle_sockets_open_at_end": alive}


def run_attack(stack: ProxyStack, attack: str, seconds: float, timeout: float,
               base: Path) -> dict:
    """One attack and the victims' figures."""
    url, proxy = stack.proxy.url, None
    stand_in = contextlib.ExitStack()
    if attack == "slow-upstream":
        store = stand_in.enter_context(slow_store(stack.prometheus.url, SLOW_UPSTREAM_S))
        (base / "slow-store").mkdir(exist_ok=True)
        port = free_port()
        proxy = Daemon("slow-store-proxy", [
            str(Path(sys.executable).parent / "slurm-gpu-proxy"), "--prometheus-url", store,
            "--web.listen-address", f"127.0.0.1:{port}", "--web.config.file",
            str(base / "web.yml"), "--config", str(base / "proxy.yml"), "--admin", "root"],
            port, (base / "slow-store"))
        proxy.wait_ready()
        url = proxy.url

    async def both() -> dict:
        deadline = time.monotonic() + seconds
        victims = asyncio.ensure_future(_victims(url, deadline, timeout))
        if attack == "idle-hold":
            figures = await _hold_idle(int(url.rsplit(":", 1)[1]), deadline)
        else:
            query, in_flight = {"slow-parse-user": (SLOW_REGEX_USER, 8),
                                "slow-parse-nocount": (SLOW_REGEX_NOCOUNT, 8),
                                "slow-upstream": (SLOW_UPSTREAM_QUERY, 70)}[attack]
            statuses = await _query_flood(url, query, in_flight, deadline,
                                          SLOW_UPSTREAM_S + timeout)
            figures = {"attack_answers": dict(sorted(statuses.items()))}
        figures.update(await victims)
        return figures

    try:
        return {"attack": attack, "seconds": seconds, **asyncio.run(both())}
    finally:
        if proxy is not None:
            proxy.stop()
        stand_in.close()
