"""CPU of ``CgroupFS.find_jobs`` on this node's real cgroup mount (issue 49).

In process, ``time.thread_time()``: best of 5 rounds of 2,000 calls, in microseconds
per call. Run it against another checkout with ``PYTHONPATH=<checkout>``; the module
file it used is printed with the figures.

    .venv/bin/python bench/find_jobs.py [--root /sys/fs/cgroup] [--calls 2000]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from slurm_gpu_exporter.node.cgroup import CgroupFS
from slurm_gpu_exporter.node.cgroup import fs as fs_module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path("/sys/fs/cgroup"))
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    cgroups = CgroupFS(args.root)
    jobs = cgroups.find_jobs()
    rounds = []
    for _ in range(args.rounds):
        start = time.thread_time()
        for _ in range(args.calls):
            cgroups.find_jobs()
        rounds.append((time.thread_time() - start) / args.calls * 1e6)
    cgroups.close()
    print(json.dumps({
        "module": fs_module.__file__, "roots": [str(p) for p in cgroups.slurm_roots()],
        "jobs": len(jobs), "us_per_call_best": round(min(rounds), 1),
        "us_per_call_rounds": [round(r, 1) for r in rounds],
        "load_1m": round(os.getloadavg()[0], 2),
    }, indent=1))


if __name__ == "__main__":
    main()
