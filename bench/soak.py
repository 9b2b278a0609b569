"""Soak: job churn plus scrapes at 10/s for a long run (not part of CI).

    .venv/bin/python bench/soak.py            # 30 minutes, as release checks ask
    .venv/bin/python bench/soak.py --minutes 4

Runs the real agent over a synthetic node (slurm_gpu_exporter/sim/synthnode.py) with the fake NVML
(tests/fakenvml, built with cc on first use). A job starts about every second and
ends some seconds later; a scraper thread fetches /metrics ten times a second.
Prints the agent's RSS, open files, threads and sample time at the start (after a
one-minute warm-up) and at the end, and keeps them in bench/results/soak.json.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import record

from slurm_gpu_exporter.sim.synthnode import SynthNode
from tests.fakenvml import Device, NvmlState, Pattern, Process, fake_nvml_or_skip
from tests.jobs.churn import end_job, open_files, rss_kib, threads
from tests.support.agent import Agent, series


def _figures(agent: Agent) -> dict[str, float]:
    text = agent.metrics()
    [total] = [v for lab, v in series(text, "slurm_gpu_exporter_sample_duration_seconds")
               if lab.get("step") in ("total", None) and lab.get("source") in ("total", None)
               ] or [float("nan")]
    pid = agent.proc.pid
    return {"rss_kib": rss_kib(pid), "open_files": open_files(pid),
            "threads": threads(pid), "sample_seconds": total}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--minutes", type=float, default=30.0)
    p.add_argument("--warmup", type=float, default=60.0, help="seconds before the start figures")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="sge-soak-") as tmp:
        base = Path(tmp)
        fake = fake_nvml_or_skip(base / "nvml")
        now = time.time()
        fake.write(NvmlState(devices=[Device(i, processes=[
            Process(900 + i, 2**30, sm=Pattern.constant(50), start_time=now)])
            for i in range(4)]))
        node = SynthNode(base / "node")
        agent = Agent(node.agent_args(1.0, "--job-linger", "10"), env=fake.env(),
                      log_path=base / "agent.log")
        stop = threading.Event()
        scrapes = [0, 0]  # ok, failed

        def scraper() -> None:
            while not stop.is_set():
                try:
                    with urllib.request.urlopen(agent.url + "/metrics", timeout=5) as r:
                        r.read()
                    scrapes[0] += 1
                except OSError:
                    scrapes[1] += 1
                time.sleep(0.1)

        try:
            agent.wait_ready()
            thread = threading.Thread(target=scraper, daemon=True)
            thread.start()
            rng = random.Random(6)
            live: list[tuple[float, int]] = []
            jobid, started = 1, time.monotonic()
            end_at = started + args.warmup + args.minutes * 60
            start_figures: dict[str, float] | None = None
            while time.monotonic() < end_at:
                gpu = jobid % 4
                node.add_job(jobid, [10_000 + jobid], job_gpus=str(gpu))
                live.append((time.monotonic() + rng.uniform(2, 20), jobid))
                jobid += 1
                for item in [x for x in live if x[0] <= time.monotonic()]:
                    live.remove(item)
                    end_job(node, item[1])
                if start_figures is None and time.monotonic() - started >= args.warmup:
                    start_figures = _figures(agent)
                    print("start", start_figures, flush=True)
                time.sleep(1.0)
            end_figures = _figures(agent)
            print("end", end_figures, flush=True)
        finally:
            stop.set()
            agent.stop()
    assert start_figures is not None
    record("soak", {
        "minutes": args.minutes, "jobs": jobid - 1, "scrapes_ok": scrapes[0],
        "scrapes_failed": scrapes[1],
        **{f"start_{k}": v for k, v in start_figures.items()},
        **{f"end_{k}": v for k, v in end_figures.items()},
        "rss_growth_kib": end_figures["rss_kib"] - start_figures["rss_kib"],
    })
    return 0


if __name__ == "__main__":
    sys.exit(main())
