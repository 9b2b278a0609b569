"""Basic auth on the real agent against a hostile client: long passwords, probing for
user names by timing, and a flood of wrong passwords right after a re-read."""

from __future__ import annotations

import base64
import http.client
import os
import signal
import statistics
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import bcrypt
import pytest

from tests.agent import Agent
from tests.support import wait_until

pytestmark = [pytest.mark.process]

PASSWORD = "good"
HASH = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=10)).decode()  # ~50 ms


def _auth(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def _status(agent: Agent, headers: dict[str, str]) -> tuple[int, float]:
    start = time.monotonic()
    conn = http.client.HTTPConnection("127.0.0.1", agent.port, timeout=30)
    try:
        conn.request("GET", "/metrics", headers=headers)
        status = conn.getresponse().status
    finally:
        conn.close()
    return status, time.monotonic() - start


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


def test_timing_does_not_tell_an_unknown_user_from_a_wrong_password(
        agent: tuple[Agent, Path]) -> None:
    _status(agent[0], _auth("nobody", "x"))  # the first one also makes the dummy hash
    unknown, wrong = [], []
    for i in range(6):
        unknown.append(_status(agent[0], _auth(f"nobody{i}", "x"))[1])
        wrong.append(_status(agent[0], _auth("prom", f"wrong{i}"))[1])
    ratio = statistics.median(unknown) / statistics.median(wrong)
    print(f"median unknown user {statistics.median(unknown) * 1000:.1f} ms, "
          f"wrong password {statistics.median(wrong) * 1000:.1f} ms")
    assert 0.5 < ratio < 2.0


def test_a_flood_of_wrong_passwords_after_a_reread_does_not_hold_up_a_valid_scrape(
        agent: tuple[Agent, Path]) -> None:
    scraper, web = agent
    web.write_text(f"basic_auth_users:\n  prom: '{HASH}'\n  other: '{HASH}'\n")
    scraper.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: "re-read" in scraper.log(), 10, "the web config re-read",
               log=scraper.log)
    with ThreadPoolExecutor(max_workers=50) as pool:
        flood = [pool.submit(_status, scraper, _auth("prom", f"wrong{i}")) for i in range(200)]
        time.sleep(0.2)  # the flood is queued (or refused) by now
        status, took = _status(scraper, _auth("prom", PASSWORD))
        answers = [f.result(timeout=60) for f in flood]
    print(f"valid scrape in {took * 1000:.0f} ms; flood answers "
          f"{sorted({s for s, _ in answers})}, slowest {max(t for _, t in answers):.2f} s")
    assert status == 200 and took < 1.0
    assert {s for s, _ in answers} <= {401, 503}
