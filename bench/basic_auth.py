"""Basic auth on the agent (simulated node, bcrypt cost 10): how long an answer takes
for an unknown user, a wrong password, a header that needs no check and a credential
already verified; and a valid scrape during a flood of 200 wrong passwords right after
a re-read of the web config. The timing figures that the tests leave to a quiet
machine: an unknown user must not be told from a wrong password by its timing."""

from __future__ import annotations

import base64
import http.client
import os
import signal
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import bcrypt

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from common import percentile, record  # noqa: E402

from tests.support import wait_until  # noqa: E402
from tests.support.agent import Agent  # noqa: E402

PASSWORD = "good"
RUNS = 30


def _auth(user: str, password: str) -> dict[str, str]:
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    return {"Authorization": f"Basic {token}"}


def _timed(agent: Agent, headers: dict[str, str]) -> tuple[int, float]:
    """(status, seconds) of one GET /metrics on a fresh connection."""
    started = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", agent.port, timeout=30)
    try:
        conn.request("GET", "/metrics", headers=headers)
        response = conn.getresponse()
        response.read()
        status = response.status
    finally:
        conn.close()
    return status, time.perf_counter() - started


def _answers(agent: Agent) -> bool:
    try:
        return _timed(agent, _auth("prom", PASSWORD))[0] == 200
    except OSError:
        return False  # not listening yet


def _ms(values: list[float]) -> dict[str, float]:
    return {"p50": round(statistics.median(values) * 1000, 1),
            "p90": round(percentile(values, 90) * 1000, 1)}


def main() -> None:
    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=10)).decode()
    with tempfile.TemporaryDirectory() as base:
        web = Path(base) / "web.yml"
        web.write_text(f"basic_auth_users:\n  prom: '{hashed}'\n")
        os.chmod(web, 0o600)
        agent = Agent(["--simulate", "--web.config.file", str(web),
                       "--web.config.reload-interval", "600"], log_path=Path(base) / "log")
        try:
            wait_until(lambda: _answers(agent), 20, "the agent's first sample", log=agent.log)
            _timed(agent, _auth("nobody", "x"))  # makes the dummy hash
            unknown, wrong, no_check, verified = [], [], [], []
            for i in range(RUNS):
                unknown.append(_timed(agent, _auth(f"nobody{i}", "x"))[1])
                wrong.append(_timed(agent, _auth("prom", f"wrong{i}"))[1])
                no_check.append(_timed(agent, {"Authorization": "Basic bm9jb2xvbg=="})[1])
                verified.append(_timed(agent, _auth("prom", PASSWORD))[1])
            web.write_text(f"basic_auth_users:\n  prom: '{hashed}'\n  other: '{hashed}'\n")
            agent.proc.send_signal(signal.SIGHUP)
            wait_until(lambda: "re-read" in agent.log(), 10, "the re-read", log=agent.log)
            with ThreadPoolExecutor(max_workers=50) as pool:
                flood = [pool.submit(_timed, agent, _auth("prom", f"wrong{i}"))
                         for i in range(200)]
                time.sleep(0.2)  # the flood is queued (or refused) by now
                status, during_flood = _timed(agent, _auth("prom", PASSWORD))
                answers = [f.result(timeout=60) for f in flood]
        finally:
            agent.stop()
    record("basic_auth", {
        "unknown_user_ms": _ms(unknown), "wrong_password_ms": _ms(wrong),
        "no_check_needed_ms": _ms(no_check), "verified_ms": _ms(verified),
        "unknown_over_wrong_p50": round(statistics.median(unknown) / statistics.median(wrong), 2),
        "valid_scrape_during_flood_ms": round(during_flood * 1000, 1),
        "valid_scrape_during_flood_status": status,
        "flood_statuses": sorted({s for s, _ in answers}),
        "load_average": os.getloadavg()[0],
    })


if __name__ == "__main__":
    main()
