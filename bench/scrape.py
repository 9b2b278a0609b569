"""/metrics latency with 8 concurrent scrapers against the agent on the simulated node."""

from __future__ import annotations

import concurrent.futures
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from common import percentile, record  # noqa: E402

from tests.support.agent import Agent  # noqa: E402

SCRAPERS = 8
PER_SCRAPER = 250
HEADERS = {"Accept": "application/openmetrics-text;version=1.0.0,text/plain;q=0.5",
           "Accept-Encoding": "gzip"}


def scrape_many(url: str) -> list[float]:
    times = []
    for _ in range(PER_SCRAPER):
        t0 = time.perf_counter()
        with urllib.request.urlopen(urllib.request.Request(url, headers=HEADERS)) as resp:
            resp.read()
        times.append((time.perf_counter() - t0) * 1000)
    return times


def main() -> None:
    agent = Agent(["--simulate", "--sample-interval", "1"])
    try:
        agent.wait_ready()
        time.sleep(2)
        with concurrent.futures.ThreadPoolExecutor(SCRAPERS) as pool:
            results = list(pool.map(scrape_many, [agent.url + "/metrics"] * SCRAPERS))
    finally:
        agent.stop()
    times = [t for r in results for t in r]
    record("scrape", {
        "scrapers": SCRAPERS,
        "requests": len(times),
        "latency_ms_p50": round(percentile(times, 50), 2),
        "latency_ms_p99": round(percentile(times, 99), 2),
        "note": "client and agent share this machine's 2 cores; the client's own time is in it",
    })


if __name__ == "__main__":
    main()
