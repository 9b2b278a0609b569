"""/metrics under a real load tool: ``wrk`` with 8 connections for 30 s at node-large.

The node is node_large.py's ``base`` variant (8 GPUs, 64 jobs, 512 GPU processes) on
the fake NVML; the agent samples every 5 s, so the run crosses several snapshots and
their first scrapes are in the figures. The request is what Prometheus sends
(OpenMetrics, gzip). wrk runs on the same 2 cores as the agent: its own CPU is in the
latencies.

    .venv/bin/python bench/scrape_wrk.py [--duration 30] [--connections 8] [--tag after]

Needs Debian's ``wrk`` (apt-get install wrk).
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from agentproc import PROMETHEUS_HEADERS, cpu_seconds, load, rss_mib  # noqa: E402
from common import record  # noqa: E402
from node_large import build  # noqa: E402

from tests.support.agent import Agent  # noqa: E402

INTERVAL = 5.0
_UNITS = {"us": 0.001, "ms": 1.0, "s": 1000.0}


def _ms(text: str) -> float:
    m = re.fullmatch(r"([\d.]+)(us|ms|s)", text)
    assert m is not None, text
    return round(float(m.group(1)) * _UNITS[m.group(2)], 3)


def parse_wrk(out: str) -> dict[str, float]:
    """Percentiles, rate and errors from ``wrk --latency`` output."""
    figures: dict[str, float] = {}
    for pct, value in re.findall(r"^\s+(50|75|90|99)%\s+(\S+)$", out, re.M):
        figures[f"latency_ms_p{pct}"] = _ms(value)
    m = re.search(r"Latency\s+\S+\s+\S+\s+(\S+)", out)
    if m:
        figures["latency_ms_max"] = _ms(m.group(1))
    m = re.search(r"^\s*(\d+) requests in", out, re.M)
    if m:
        figures["requests"] = int(m.group(1))
    m = re.search(r"Requests/sec:\s+([\d.]+)", out)
    if m:
        figures["requests_per_s"] = float(m.group(1))
    m = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    figures["non_2xx"] = int(m.group(1)) if m else 0
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=int, default=30)
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--tag", default="")
    args = parser.parse_args()
    wrk = shutil.which("wrk")
    if wrk is None:
        sys.exit("scrape_wrk: wrk is not installed (apt-get install wrk)")
    with tempfile.TemporaryDirectory(prefix="sge-bench-") as tmp:
        node, fake = build(Path(tmp), "base")
        agent = Agent(node.agent_args(INTERVAL), env=fake.env(), log_path=Path(tmp) / "agent.log")
        try:
            agent.wait_ready(60)
            time.sleep(2)
            headers = [arg for k, v in PROMETHEUS_HEADERS.items() for arg in ("-H", f"{k}: {v}")]
            cpu0, la0 = cpu_seconds(agent.proc.pid), load()
            out = subprocess.run(
                [wrk, "-t2", f"-c{args.connections}", f"-d{args.duration}s", "--latency",
                 *headers, agent.url + "/metrics"],
                capture_output=True, text=True, check=True).stdout
            cpu = cpu_seconds(agent.proc.pid) - cpu0
            rss = rss_mib(agent.proc.pid)
        finally:
            agent.stop()
    figures = parse_wrk(out)
    record("scrape_wrk" + (f"_{args.tag}" if args.tag else ""), {
        "command": "python bench/scrape_wrk.py " + " ".join(sys.argv[1:]),
        "node": "64 jobs x 8 GPUs, 512 GPU processes (fake NVML), sample interval 5 s",
        "wrk": f"wrk -t2 -c{args.connections} -d{args.duration}s --latency (OpenMetrics, gzip)",
        **figures,
        "agent_cpu_s": round(cpu, 2),
        "agent_rss_mib": round(rss, 1),
        "load_1m": round((la0 + load()) / 2, 2),
        "note": "wrk and the agent share this machine's 2 cores",
    })


if __name__ == "__main__":
    main()
