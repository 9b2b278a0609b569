"""Where the agent's CPU goes: py-spy over the running agent on node_large.py's node.

Records ``--seconds`` of stacks (all threads, without stopping the agent) and keeps
a summary in results/profile_<variant>[_<tag>].json: each thread's share of the
samples and the frames that hold the most samples, inclusive and self. py-spy
cannot tell a thread waiting inside a C library from one that runs: the fake NVML's
Xid wait (a 10 ms poll) shows far above its real CPU (see node_large's by-thread
CPU for that).

    .venv/bin/python bench/profile.py [--variant base] [--seconds 30] [--tag after]

Needs py-spy (the ``bench`` extra: pip install -e '.[bench]').
"""

from __future__ import annotations

import argparse
import collections
import os
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
from agentproc import load  # noqa: E402
from common import record  # noqa: E402
from node_large import VARIANTS, build  # noqa: E402

from tests.support.agent import Agent  # noqa: E402

TOP = 25


def summarize(raw: str) -> dict[str, object]:
    """Thread shares and top frames (percent of all samples) of py-spy's raw output."""
    total = 0
    threads: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    own: collections.Counter[str] = collections.Counter()
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        n = int(count)
        frames = stack.split(";")
        total += n
        threads[re.sub(r"\(\d+\)", "", frames[0]).replace("thread : ", "").strip()] += n
        own[frames[-1]] += n
        for frame in set(frames[1:]):
            inclusive[frame] += n

    def pct(counter: collections.Counter[str], top: int) -> dict[str, float]:
        return {k: round(100 * v / total, 1) for k, v in counter.most_common(top)}

    return {"stack_samples": total, "threads_pct": pct(threads, 10),
            "inclusive_pct": pct(inclusive, TOP), "self_pct": pct(own, TOP)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", default="base", choices=list(VARIANTS))
    parser.add_argument("--seconds", type=int, default=30)
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument("--tag", default="")
    args = parser.parse_args()
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not os.path.exists(spy):
        sys.exit("profile: py-spy is not installed (pip install -e '.[bench]')")
    with tempfile.TemporaryDirectory(prefix="sge-bench-") as tmp:
        node, fake = build(Path(tmp), args.variant)
        agent = Agent(node.agent_args(args.interval), env=fake.env(),
                      log_path=Path(tmp) / "agent.log")
        try:
            agent.wait_ready(60)
            time.sleep(max(3 * args.interval, 12.0))  # past the new-job window
            out = Path(tmp) / "stacks.txt"
            subprocess.run([spy, "record", "-p", str(agent.proc.pid), "--nonblocking",
                            "--threads", "-r", "250", "-d", str(args.seconds), "-f", "raw",
                            "-o", str(out)], capture_output=True, check=True)
            raw = out.read_text()
        finally:
            agent.stop()
    name = f"profile_{args.variant}" + (f"_{args.tag}" if args.tag else "")
    record(name, {"command": "python bench/profile.py " + " ".join(sys.argv[1:]),
                  "sample_interval_s": args.interval, "load_1m": load(), **summarize(raw)})


if __name__ == "__main__":
    main()
