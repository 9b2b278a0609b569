"""Basic auth on the real agent against a hostile client: long passwords, probing for
user names by timing, and a flood of wrong passwords right after a re-read.

Checked by what the timing stands for (a password check made or not; an answer
before or after others), not by wall-clock bounds a loaded machine can break; the
figures themselves are bench/basic_auth.py's."""

from __future__ import annotations

import base64
import http.client
import os
import signal
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import bcrypt
import pytest

from tests.support import wait_until
from tests.support.agent import Agent

pytestmark = [pytest.mark.process]

PASSWORD = "good"
HASH = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=10)).decode()  # ~50 ms


def _auth(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def _answer(agent: Agent, headers: dict[str, str]) -> tuple[int, float, float]:
    """(status, seconds it took, monotonic time it came) of one GET /metrics."""
    start = time.monotonic()
    conn = http.client.HTTPConnection("127.0.0.1", agent.port, timeout=30)
    try:
        conn.request("GET", "/metrics", headers=headers)
        status = conn.getresponse().status
    finally:
        conn.close()
    done = time.monotonic()
    return status, done - start, done


def _status(agent: Agent, headers: dict[str, str]) -> tuple[int, float]:
    status, took, _ = _answer(agent, headers)
    return status, took


def _answers(agent: Agent) -> bool:
    try:
        return _status(agent, _auth("prom", PASSWORD))[0] == 200
    except OSError:
        return False  # not listening yet


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Agent, Path]]:
    base = tmp_path_factory.mktemp("auth")
    web = base / "web.yml"
    web.write_text(f"basic_auth_users:\n  prom: '{HASH}'\n")
    os.chmod(web, 0o600)
    agent = Agent(["--simulate", "--web.config.file", str(web),
                   "--web.config.reload-interval", "600"], log_path=base / "log")
    try:
        wait_until(lambda: _answers(agent), 20, "the agent's first sample", log=agent.log)
        yield agent, web
    finally:
        agent.stop()


def test_a_password_over_72_bytes_is_401_not_500(agent: tuple[Agent, Path]) -> None:
    assert _status(agent[0], _auth("prom", "x" * 100))[0] == 401
    assert _status(agent[0], _auth("prom", PASSWORD + "\0" * 80))[0] == 401


def test_an_unknown_user_costs_a_password_check_like_a_wrong_password(
        agent: tuple[Agent, Path]) -> None:
    """Timing does not tell an unknown user from a wrong password: both cost a bcrypt
    check of the users' cost (a dummy hash for the unknown user; the unit tests check
    its cost), so even the fastest of either is many times the slowest part of an
    answer that needs no check (a header without a colon). Skipping the unknown user's
    check would make its answers as fast as those."""
    _status(agent[0], _auth("nobody", "x"))  # the first one also makes the dummy hash
    unknown, wrong, no_check = [], [], []
    for i in range(6):
        unknown.append(_status(agent[0], _auth(f"nobody{i}", "x"))[1])
        wrong.append(_status(agent[0], _auth("prom", f"wrong{i}"))[1])
        status, took = _status(agent[0], {"Authorization": "Basic bm9jb2xvbg=="})
        assert status == 401
        no_check.append(took)
    print(f"fastest unknown user {min(unknown) * 1000:.1f} ms, wrong password "
          f"{min(wrong) * 1000:.1f} ms, no check needed {min(no_check) * 1000:.1f} ms")
    assert min(unknown) > 10 * min(no_check)
    assert min(wrong) > 10 * min(no_check)


def test_a_flood_of_wrong_passwords_after_a_reread_does_not_hold_up_a_valid_scrape(
        agent: tuple[Agent, Path]) -> None:
    scraper, web = agent
    web.write_text(f"basic_auth_users:\n  prom: '{HASH}'\n  other: '{HASH}'\n")
    scraper.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: "re-read" in scraper.log(), 10, "the web config re-read",
               log=scraper.log)
    with ThreadPoolExecutor(max_workers=50) as pool:
        flood = [pool.submit(_answer, scraper, _auth("prom", f"wrong{i}")) for i in range(200)]
        # Sent once the queue of checks is full (the flood is being refused): those
        # waiting take 16 x about 50 ms / 2 threads to drain.
        wait_until(lambda: any(f.done() and f.result()[0] == 503 for f in flood), 30,
                   "the queue of password checks to fill")
        status, took, done = _answer(scraper, _auth("prom", PASSWORD))
        answers = [f.result(timeout=60) for f in flood]
    checked = [t for s, _, t in answers if s == 401]
    print(f"valid scrape in {took * 1000:.0f} ms; flood answers "
          f"{sorted({s for s, _, _ in answers})}, slowest {max(t for _, t, _ in answers):.2f} s")
    assert {s for s, _, _ in answers} <= {401, 503}
    # Its credential was verified before the re-read: it needs no check, so it is
    # answered while the flood's checks still wait, not after them.
    assert status == 200
    assert checked and done < max(checked), "the valid scrape waited behind the flood"
