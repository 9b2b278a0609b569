"""``archive``'s own CPU: the report's code alone, checkouts side by side.

``bench/archive.py`` times the whole ``slurm-gpu-report archive`` process; on a busy
2-core machine its walls move by 10 % from run to run, more than a change of the
report's code does. This one takes Prometheus' parsing and the process start out:
the answers of one real Prometheus (``bench/report.py``'s synthetic jobs, ended in the
last 2 hours) are fetched once per child, then ``archive()`` (reading the answers,
building the details and rows, the SQLite upserts and roll-up) runs ``--runs`` times
in process, each into a new archive, and its CPU seconds (``time.process_time``) are
kept. Each checkout named runs in its own child, turn by turn for ``--rounds``, so a
load that comes and goes falls on all of them alike. Short turns compare best: this
machine's speed drifts by 15 % within minutes (the yardstick), so ``--runs 3 --rounds
20`` beats ``--runs 12 --rounds 5``.

    git worktree add ../before REV
    .venv/bin/python bench/archive_cpu.py --jobs 2000 --source before=../before \\
        --source now=. [--rounds 20] [--runs 3] [--tag T]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

# The child: this file run with --child, its checkout first on the path (-P).
CHILD = """
import asyncio, gc, json, sys, tempfile, time
url, end, runs = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
from slurm_gpu_exporter.report.archive.collect import archive
from slurm_gpu_exporter.report.archive.store import ArchiveStore
from slurm_gpu_exporter.report.figures.rules import load_config
from slurm_gpu_exporter.report.figures.window import Window
from slurm_gpu_exporter.report.prometheus import client
from slurm_gpu_exporter.report.prometheus.queries import Filters

answers = {}
fetch = client.PrometheusClient.instant

async def instant(self, query, at):  # each answer fetched and parsed once
    if query not in answers:
        answers[query] = await fetch(self, query, at)
    self.queries += 1
    return answers[query]

client.PrometheusClient.instant = instant

async def once(db):
    async with client.PrometheusClient(client.Connection(url=url, timeout_s=120)) as prom:
        with ArchiveStore(db, write=True) as store:
            gcs = sum(s["collections"] for s in gc.get_stats())
            cpu = time.process_time()
            run = await archive(prom, store, Window(end - 7200, end), Filters(),
                                load_config(None), lambda window: {}, end)
            return (time.process_time() - cpu,
                    sum(s["collections"] for s in gc.get_stats()) - gcs, run)

where = tempfile.mkdtemp()
asyncio.run(once(f"sqlite:///{where}/warm.sqlite"))  # fetches the answers
out = [asyncio.run(once(f"sqlite:///{where}/{i}.sqlite")) for i in range(runs)]
print(json.dumps({"cpu_s": [round(o[0], 4) for o in out], "gc": [o[1] for o in out],
                  "stored": out[0][2].stored, "queries": out[0][2].queries}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--source", action="append", required=True,
                        help="NAME=DIR: a checkout to time (give two or more)")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--runs", type=int, default=3, help="archive() runs per child")
    parser.add_argument("--tag", default="", help="write results/archive_cpu_<tag>.json")
    args = parser.parse_args()

    from bench.archive import _ended_jobs
    from bench.common import record
    from bench.report import build_tsdb, start_prometheus

    sources = dict(s.split("=", 1) for s in args.source)
    work = Path(tempfile.mkdtemp(prefix="bench-archive-cpu-"))
    end = time.time() // 60 * 60
    data, samples = build_tsdb(_ended_jobs(args.jobs, end), end, work)
    proc, url = start_prometheus(data, work)
    cpus: dict[str, list[float]] = {name: [] for name in sources}
    medians: dict[str, list[float]] = {name: [] for name in sources}
    figures: dict[str, object] = {"jobs": args.jobs, "samples": samples,
                                  "rounds": args.rounds, "runs": args.runs}
    try:
        for _ in range(args.rounds):
            for name, source in sources.items():
                env = {**os.environ, "PYTHONPATH": str(Path(source).resolve())}
                out = subprocess.run([sys.executable, "-P", "-c", CHILD, url, f"{end:.0f}",
                                      str(args.runs)], env=env, capture_output=True,
                                     text=True, check=False)
                if out.returncode != 0:
                    raise RuntimeError(f"{name}: {out.stderr[-2000:]}")
                got = json.loads(out.stdout)
                cpus[name] += got["cpu_s"]
                medians[name].append(round(statistics.median(got["cpu_s"]), 4))
                figures[f"{name}_stored"] = got["stored"]
                figures[f"{name}_queries"] = got["queries"]
                figures[f"{name}_gc_collections"] = got["gc"][0]
    finally:
        proc.terminate()
        proc.wait(30)
    for name in sources:
        figures[f"{name}_cpu_s_least"] = round(min(cpus[name]), 4)
        figures[f"{name}_cpu_s_median"] = round(statistics.median(cpus[name]), 4)
        figures[f"{name}_cpu_s_median_by_round"] = medians[name]
    record(f"archive_cpu_{args.tag}" if args.tag else "archive_cpu", figures)


if __name__ == "__main__":
    main()
