"""Issue 45's attacks by one ordinary user, against the real proxy in front of a real
Prometheus: the other users and the admins must still be answered. One user's slow
queries take one query checker at a time and then back off; silent sockets at the
connection cap are closed for a caller who asks; one user's slow upstream queries take
their share of the store's connections, not the admins' nor everyone's; an answer past
the body cap is refused naming the limit."""

from __future__ import annotations

import collections
import socket
import sys
import threading
import time
import urllib.parse
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.proxy.slow_store import slow_store
from tests.proxy.stack import Answer, ProxyStack, basic, request, start
from tests.support import free_port, wait_until
from tests.support.daemons import Daemon

pytestmark = [pytest.mark.process, pytest.mark.prometheus]

# The issue's query: 20 regexes of \w{300}, 313 bytes; seconds to parse.
ISSUE_QUERY = "x{" + ",".join(f'l{i}=~"\\\\w{{300}}"' for i in range(20)) + "}"
# The same cost with no count for the text bound to see: what the share and back-off
# must catch (6 KB, about a second to parse, more on a loaded machine).
SLOW_NO_COUNT = "x{" + ",".join(f'l{i}=~"' + "\\\\w" * 100 + '"' for i in range(30)) + "}"
# What the others may wait (generous: the machine is shared and loaded; the issue
# measured 2 answers in 11 s, the slowest 3.7 s).
VICTIM_P90_S = 1.0
VICTIM_MAX_S = 3.0
STORE_DELAY_S = 6.0


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyStack]:
    base = tmp_path_factory.mktemp("fairness")
    running = start(base)
    try:
        wait_until(lambda: running.prometheus.vector("slurm_job_info"), 60,
                   "Prometheus to have scraped the agent", log=running.prometheus.log)
        yield running
    finally:
        running.stop()


def _proxy(stack: ProxyStack, store: str, name: str, *flags: str) -> Daemon:
    """Another proxy with the stack's users, in front of ``store``."""
    base = Path(stack.proxy.log_path).parent
    workdir = base / name
    workdir.mkdir(exist_ok=True)
    port = free_port()
    proxy = Daemon(name, [
        str(Path(sys.executable).parent / "slurm-gpu-proxy"), "--prometheus-url", store,
        "--web.listen-address", f"127.0.0.1:{port}", "--web.config.file",
        str(base / "web.yml"), "--config", str(base / "proxy.yml"), "--admin", "root",
        *flags], port, workdir)
    try:
        proxy.wait_ready()
    except BaseException:
        proxy.stop()
        raise
    return proxy


def _query(url: str, user: str, query: str) -> tuple[float, Answer]:
    body = urllib.parse.urlencode({"query": query}).encode()
    started = time.perf_counter()
    with ThreadPoolExecutor(1) as pool:  # a stuck proxy fails the test, never hangs it
        answer = pool.submit(request, f"{url}/api/v1/query", basic(user), body).result(30)
    return time.perf_counter() - started, answer


class Flood:
    """``in_flight`` of ``user``'s queries at all times for ``seconds``, on threads
    while the test measures; ``seen``: answers by status and errorType."""

    def __init__(self, url: str, user: str, query: str, in_flight: int,
                 seconds: float) -> None:
        self.deadline = time.monotonic() + seconds
        self.url, self.user, self.query = url, user, query
        self.seen: collections.Counter[str] = collections.Counter()
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._loop, daemon=True)
                        for _ in range(in_flight)]
        for thread in self.threads:
            thread.start()

    def _loop(self) -> None:
        while time.monotonic() < self.deadline:
            _, answer = _query(self.url, self.user, self.query)
            kind = (answer.body or {}).get("errorType", "") if answer.status != 200 else ""
            with self.lock:
                self.seen[f"{answer.status} {kind}".strip()] += 1
            if answer.status in (429, 503):
                time.sleep(0.05)  # an attacker who comes straight back

    def join(self) -> collections.Counter[str]:
        for thread in self.threads:
            thread.join(60)
        return self.seen


def _victim(url: str, user: str, query: str, seconds: float) -> list[tuple[float, int]]:
    """(seconds, status) of ``user``'s query every 0.3 s for ``seconds``."""
    out = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        took, answer = _query(url, user, query)
        out.append((took, answer.status))
        time.sleep(0.3)
    return out


def test_one_users_slow_parse_flood_leaves_another_user_served(stack: ProxyStack) -> None:
    # Issue 45: alice kept 8 slow-to-parse queries in flight; bob, asking every 0.5 s,
    # got 2 answers in 11 s. Now alice has one checker at a time and backs off.
    url = stack.proxy.url
    flood = Flood(url, "alice", SLOW_NO_COUNT, 8, 8.0)
    time.sleep(0.5)  # the flood is on
    bob = _victim(url, "bob", "count(up)", 6.0)
    seen = flood.join()
    times = [took for took, _ in bob]
    assert len(bob) >= 8 and all(status == 200 for _, status in bob), bob
    p90 = sorted(times)[int(0.9 * (len(times) - 1))]
    assert p90 < VICTIM_P90_S and max(times) < VICTIM_MAX_S, times
    assert seen["400 slow_query"] >= 1 and seen["429 backoff"] >= 1, seen
    # alice is asked to wait; once it is over she is served again.
    wait_until(lambda: _query(url, "alice", "count(up)")[1].status == 200, 70,
               "alice's back-off to end")


def test_the_issues_regex_count_is_refused_at_once_naming_the_bound(
        stack: ProxyStack) -> None:
    took, answer = _query(stack.proxy.url, "carol", ISSUE_QUERY)
    assert answer.status == 400 and answer.body["errorType"] == "limit", answer.text
    assert "300 times" in answer.body["error"] and "100 allowed" in answer.body["error"]
    assert took < 1.0  # never parsed


@pytest.fixture(scope="module")
def capped(stack: ProxyStack) -> Iterator[Daemon]:
    """A proxy capped at 16 connections and 4,000-byte answers."""
    proxy = _proxy(stack, stack.prometheus.url, "capped", "--web.max-connections", "16",
                   "--limits.upstream-body-bytes", "4000")
    try:
        yield proxy
    finally:
        proxy.stop()


def test_idle_sockets_at_the_cap_do_not_keep_an_admin_out(capped: Daemon) -> None:
    # Issue 45: with the cap at 16 and 16 idle sockets open, an admin was refused.
    held = [socket.create_connection(("127.0.0.1", capped.port), timeout=5)
            for _ in range(24)]
    try:
        time.sleep(0.5)  # all accepted, none young any more
        for _ in range(3):
            took, answer = _query(capped.url, "root", "count(slurm_job_info)")
            assert answer.status == 200 and answer.body["data"]["result"], answer.text
            assert took < VICTIM_MAX_S
            took, answer = _query(capped.url, "bob", "count(up)")
            assert answer.status == 200, answer.text
    finally:
        for conn in held:
            conn.close()


def test_an_answer_past_the_body_cap_is_502_naming_the_limit(capped: Daemon) -> None:
    _, answer = _query(capped.url, "root", '{__name__=~"slurm_.+"}')
    assert answer.status == 502 and answer.body["errorType"] == "too_large", answer.text
    assert "4000 bytes" in answer.body["error"]
    assert "--limits.upstream-body-bytes" in answer.body["error"]
    _, small = _query(capped.url, "root", "count(up)")
    assert small.status == 200, small.text


def test_one_users_slow_upstream_flood_leaves_admins_and_others_served(
        stack: ProxyStack) -> None:
    # Issue 45: 70 slow upstream queries of one user held the one pool of 64 connections
    # that admins shared: an admin waited for one to end.
    with slow_store(stack.prometheus.url, STORE_DELAY_S) as store:
        proxy = _proxy(stack, store, "slow-store")
        try:
            body = urllib.parse.urlencode({"query": "sum(slow_metric)"}).encode()
            url = f"{proxy.url}/api/v1/query"
            with ThreadPoolExecutor(70) as pool:
                flood = [pool.submit(request, url, basic("alice"), body) for _ in range(70)]
                time.sleep(1.0)  # every one of them is in
                admin_took, admin = _query(proxy.url, "root", "count(slurm_job_info)")
                bob_took, bob = _query(proxy.url, "bob", "count(up)")
                answers = [f.result(60) for f in flood]
        finally:
            proxy.stop()
    assert admin.status == 200 and bob.status == 200, (admin.text, bob.text)
    assert admin_took < VICTIM_MAX_S and bob_took < VICTIM_MAX_S, (admin_took, bob_took)
    statuses = collections.Counter(a.status for a in answers)
    # alice's share: 16 at the store; the rest wait 5 s, less than the store holds
    # hers, and are told to retry.
    assert statuses[503] >= 20 and statuses[200] >= 16, statuses



def test_one_clients_busy_connections_take_its_share_of_the_cap_only(
        stack: ProxyStack) -> None:
    # Connections in a request are never closed for a new one: without a cap per
    # address, one client's slow requests (a body that never ends, here) filled the
    # cap and everyone else was refused until they timed out.
    proxy = _proxy(stack, stack.prometheus.url, "per-client", "--web.max-connections", "8",
                   "--web.max-connections-per-client", "4")
    held = []
    try:
        head = (b"POST /api/v1/query HTTP/1.1\r\nHost: x\r\nAuthorization: "
                + basic("alice")["Authorization"].encode()
                + b"\r\nContent-Type: application/x-www-form-urlencoded\r\n"
                b"Content-Length: 1000\r\n\r\nquery=")
        for _ in range(10):  # from another loopback address than the others'
            conn = socket.create_connection(("127.0.0.1", proxy.port), timeout=5,
                                            source_address=("127.0.0.2", 0))
            conn.sendall(head)
            held.append(conn)
            time.sleep(0.05)
        time.sleep(0.5)  # all in their request (reading the body)
        for who, query in (("root", "count(slurm_job_info)"), ("bob", "count(up)")):
            took, answer = _query(proxy.url, who, query)
            assert answer.status == 200, (who, answer.text)
            assert took < VICTIM_MAX_S
    finally:
        for conn in held:
            conn.close()
        proxy.stop()
