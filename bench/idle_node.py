"""The agent on a node without jobs, two checkouts side by side: CPU per 5 s sample and RSS.

Four agents run at once for the same window (so the machine's load falls on all of
them alike): this checkout and another (``--also DIR``, e.g. the code before a change,
run with ``PYTHONPATH=DIR``), each over the fake NVML's four GPUs as real drivers
answer when idle (no samples: the buffer reads answer NOT_FOUND) and with idle GPUs
that keep taking a sample every period (the fake's ``idle_samples``). The spool is
empty, Slurm is not asked (``--slurm-lookup off``), the cgroups are the machine's own.
CPU comes from /proc/<pid>/stat in 10 ms ticks: run it for minutes. Each figure is
given against the yardstick (bench/common.py) of the same run.

    .venv/bin/python bench/idle_node.py --also DIR [--window 300] [--tag X]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from agentproc import by_thread, cpu_seconds, last_sample, load, rss_mib, thread_cpu  # noqa: E402
from common import record, yardstick  # noqa: E402

from tests.fakenvml import Device, FakeNvml, NvmlState  # noqa: E402
from tests.support.agent import Agent  # noqa: E402

INTERVAL = 5.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--also", type=Path, help="another checkout, measured beside this one")
    parser.add_argument("--window", type=float, default=300.0)
    parser.add_argument("--warmup", type=float, default=30.0)
    parser.add_argument("--tag", default="")
    args = parser.parse_args()
    codes = {"this": None, **({"also": args.also.resolve()} if args.also else {})}
    agents: dict[str, Agent] = {}
    with tempfile.TemporaryDirectory(prefix="sge-bench-") as tmp:
        try:
            for code, path in codes.items():
                for mode in ("not_found", "idle_samples"):
                    where = Path(tmp) / f"{code}-{mode}"
                    (where / "spool").mkdir(parents=True)
                    fake = FakeNvml(where / "nvml")
                    fake.write(NvmlState(devices=[Device(i) for i in range(4)],
                                         idle_samples=mode == "idle_samples"))
                    env = {**fake.env(), **({"PYTHONPATH": str(path)} if path else {})}
                    agents[f"{code}/{mode}"] = Agent(
                        ["--spool-dir", str(where / "spool"), "--state-dir", str(where / "state"),
                         "--sample-interval", str(INTERVAL), "--slurm-lookup", "off"],
                        env=env, log_path=where / "agent.log")
            for agent in agents.values():
                agent.wait_ready(60)
            time.sleep(args.warmup)  # the buffers' span learned, held files opened
            at_start = yardstick()
            before = {k: (a.proc.pid, last_sample(a.url), cpu_seconds(a.proc.pid),
                          thread_cpu(a.proc.pid)) for k, a in agents.items()}
            time.sleep(args.window)
            figures: dict[str, object] = {}
            at_end = yardstick()
            ruler = (at_start["cpu_ms"] + at_end["cpu_ms"]) / 2
            for key, agent in agents.items():
                pid, ts0, cpu0, threads0 = before[key]
                cpu, threads1 = cpu_seconds(pid) - cpu0, thread_cpu(pid)
                samples = max(1, round((last_sample(agent.url) - ts0) / INTERVAL))
                ms = cpu * 1000 / samples
                figures[key] = {"samples": samples, "cpu_ms_per_sample": round(ms, 2),
                                "yardsticks_per_sample": round(ms / ruler, 4),
                                "by_thread": by_thread(pid, threads0, threads1, cpu, samples),
                                "rss_mib": round(rss_mib(pid), 1)}
                print(key, figures[key], flush=True)
        finally:
            for agent in agents.values():
                agent.stop()
    record("idle_node" + (f"_{args.tag}" if args.tag else ""),
           {"command": "python bench/idle_node.py " + " ".join(sys.argv[1:]),
            "also": str(args.also) if args.also else None, "window_s": args.window,
            "yardstick_window": [at_start, at_end], "load_end": load(),
            "cpus": os.cpu_count(), "agents": figures})


if __name__ == "__main__":
    main()
