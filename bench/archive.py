"""The job archive: reads over 1,000,000 archived jobs (SQLite), and ``archive`` of 100 and
10,000 ended jobs from a real Prometheus.

``--part store``: writes 1,000,000 jobs spread over the last 365 days (1 to 8 GPUs, 2,000
users, 200 accounts, 2 clusters) through the store's own upserts, then times
``slurm-gpu-report usage --month`` and ``usage --by user --since 365d`` end to end
(process start to exit) and the archive look-up of ``job JOBID --db`` (in process:
the CLI's ``job`` asks Prometheus first).

``--part prometheus``: synthetic agent metrics of jobs that ended in the last 2 hours
(``bench/report.py``'s generator, 60 s samples) in TSDB blocks made with promtool, a
Prometheus over them, and ``slurm-gpu-report archive --since 2h`` timed end to end for
100 and 10,000 jobs; the query count must be the same. Each run's CPU seconds (user and
system) are kept too: ``--runs N`` runs it N times, and the least CPU is the figure to
compare (a loaded machine moves walls far more). ``--source DIR`` times another
checkout's ``slurm-gpu-report`` (``git worktree add DIR REV``) with the same data.

    .venv/bin/python bench/archive.py [--part store|prometheus|all] [--jobs 1000000]
        [--prometheus-jobs 100,10000] [--runs 2] [--source DIR] [--tag T]
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import RESULTS, record
from bench.report import Job, build_tsdb, start_prometheus
from slurm_gpu_exporter.report.archive.rows import ArchiveRecord
from slurm_gpu_exporter.report.archive.store import ArchiveStore
from slurm_gpu_exporter.report.figures.shapes import (
    Accounting,
    GpuDetail,
    JobDetail,
    JobUsage,
    NodeDetail,
)

REPORT = [str(Path(sys.executable).parent / "slurm-gpu-report")]
WRITE_BATCH = 10_000


def _archived_job(rng: random.Random, i: int, now: float) -> ArchiveRecord:
    end = now - rng.uniform(0, 365 * 86400)
    held = min(86400.0, max(300.0, rng.lognormvariate(8.3, 0.9)))
    gpus = rng.choice([1, 1, 1, 2, 2, 4, 8])
    ratio = rng.random()
    user = rng.randrange(2000)
    node = NodeDetail(node=f"gpu{rng.randrange(400):03d}", cpus=8 * gpus, cpu_s=held * gpus * 4,
                      memory_peak=2**34, memory_limit=2**35)
    node.gpus = [GpuDetail(gpu=str(g), uuid=f"GPU-{i}-{g}", allocated_s=held,
                           busy_s=held * ratio, memory_peak=2**33, memory_total=80 * 2**30,
                           energy_j=held * 350, sm_active_s=held * ratio / 2)
                 for g in range(gpus)]
    usage = JobUsage(jobid=str(1_000_000 + i), user=f"user{user:04d}",
                     account=f"acct{user % 200:03d}", partition=rng.choice(["gpu", "a100",
                                                                            "h100", "debug"]),
                     name=f"train-{i}", cluster=rng.choice(["alpha", "beta"]), gpus=gpus,
                     allocated_s=held * gpus, busy_s=held * gpus * ratio,
                     gpu_memory_peak=2**33, start=end - held, end=end,
                     sm_active_s=held * gpus * ratio / 2, gpm_allocated_s=held * gpus)
    acct = Accounting(state=rng.choice(["COMPLETED", "COMPLETED", "FAILED", "TIMEOUT",
                                        "CANCELLED"]), time_limit_s=86400,
                      requested_memory=2**35, cpus=8 * gpus, nodes=1, start=end - held,
                      end=end, exit_code="0:0", account=usage.account, qos="normal",
                      requested_gpus=gpus)
    detail = JobDetail(usage=usage, nodes=[node], accounting=acct, now=end, notes=[])
    return ArchiveRecord(detail, {(node.node, g.gpu): "NVIDIA H100 80GB HBM3"
                                  for g in node.gpus})


def _timed_cli(*args: str, runs: int = 3) -> list[float]:
    walls = []
    for _ in range(runs):
        started = time.monotonic()
        out = subprocess.run([*REPORT, *args, "--format", "json"], capture_output=True,
                             text=True, check=False)
        walls.append(time.monotonic() - started)
        if out.returncode != 0:
            raise RuntimeError(out.stderr)
    return walls


def bench_store(jobs: int, work: Path) -> dict[str, object]:
    now = time.time()
    path = work / "archive.sqlite"
    url = f"sqlite:///{path}"
    rng = random.Random(21)
    started = time.monotonic()
    with ArchiveStore(url, write=True) as store:
        for lo in range(0, jobs, WRITE_BATCH):
            batch = range(lo, min(jobs, lo + WRITE_BATCH))
            store.store([_archived_job(rng, i, now) for i in batch], archived_at=now)
        counts = store.counts()
    write_s = time.monotonic() - started
    month = datetime.fromtimestamp(now - 45 * 86400, UTC).strftime("%Y-%m")
    figures: dict[str, object] = {
        "jobs": counts[0], "gpu_rows": counts[1], "write_s": round(write_s, 1),
        "write_jobs_per_s": round(jobs / write_s), "file_mib": round(path.stat().st_size / 2**20),
        "usage_budget_s": 2, "job_budget_ms": 100,
    }
    for name, args in (("usage_month", ("usage", "--by", "account", "--month", month)),
                       ("usage_by_user_365d", ("usage", "--by", "user", "--since", "365d"))):
        walls = _timed_cli(*args, "--db", url)
        figures[f"{name}_wall_s_median"] = round(statistics.median(walls), 3)
        figures[f"{name}_wall_s_max"] = round(max(walls), 3)
    ids = [str(1_000_000 + rng.randrange(jobs)) for _ in range(50)]
    lookups = []
    with ArchiveStore(url, write=False) as store:
        for jobid in ids:
            started = time.monotonic()
            found = store.details([jobid])
            lookups.append(time.monotonic() - started)
            assert jobid in found
    figures["job_lookup_ms_median"] = round(1000 * statistics.median(lookups), 2)
    figures["job_lookup_ms_max"] = round(1000 * max(lookups), 2)
    # What every CLI call pays before its first query: interpreter and imports.
    figures["cli_start_s_median"] = round(statistics.median(
        _timed_walls([*REPORT, "default-config"])), 3)
    return figures


def _timed_walls(argv: list[str], runs: int = 3) -> list[float]:
    walls = []
    for _ in range(runs):
        started = time.monotonic()
        subprocess.run(argv, capture_output=True, check=True)
        walls.append(time.monotonic() - started)
    return walls


def _ended_jobs(count: int, end: float, seed: int = 2) -> list[Job]:
    """Jobs that ended in the last 2 hours (a busy large cluster's worth for 10,000)."""
    rng = random.Random(seed)
    jobs = []
    for i in range(count):
        finish = end - rng.uniform(360, 7200)
        duration = rng.uniform(600, 5400)
        gpus = rng.choice([1, 1, 2, 4, 8])
        user = f"user{rng.randrange(300):03d}"
        jobs.append(Job(jobid=2_000_000 + i, user=user, account=f"acct{hash(user) % 40:02d}",
                        start=finish - duration, end=finish, gpus=gpus,
                        nodes=[f"gpu{rng.randrange(400):03d}"], ratio=rng.random(),
                        used_gpus=gpus))
    return jobs


def _cpu_of_child(argv: list[str]) -> tuple[subprocess.CompletedProcess[str], float, float]:
    """Run ``argv``; its answer, wall seconds and CPU seconds (user + system), the CPU
    being what a loaded machine changes least."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    out = subprocess.run(argv, capture_output=True, text=True, check=False)
    wall = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return out, wall, cpu


def bench_prometheus(counts: list[int], work: Path, runs: int) -> dict[str, object]:
    figures: dict[str, object] = {"archive_budget_s": 30}
    queries = set()
    for count in counts:
        end = time.time() // 60 * 60
        run_dir = work / f"prom-{count}"
        run_dir.mkdir()
        data, samples = build_tsdb(_ended_jobs(count, end), end, run_dir)
        proc, url = start_prometheus(data, run_dir)
        try:
            walls, cpus, stored = [], [], 0
            for i in range(max(2, runs)):  # later runs upsert the same jobs again
                db = f"sqlite:///{run_dir / ('archive.sqlite' if i < 2 else f'again{i}.sqlite')}"
                out, wall, cpu = _cpu_of_child(
                    [*REPORT, "archive", "--since", "2h", "--end", f"{end:.0f}", "--db", db,
                     "--no-sacct", "--prometheus-url", url, "--timeout", "120"])
                walls.append(wall)
                cpus.append(cpu)
                if out.returncode != 0:
                    raise RuntimeError(out.stderr)
                words = out.stdout.split()
                stored = int(words[1])
                queries.add(int(words[words.index("PromQL") - 1]))
                figures[f"jobs_{count}_queries"] = int(words[words.index("PromQL") - 1])
                if i == 1:
                    with ArchiveStore(db, write=False) as store:
                        rows = store.counts()
        finally:
            proc.terminate()
            proc.wait(30)
        figures[f"jobs_{count}_samples"] = samples
        figures[f"jobs_{count}_archived"] = stored
        figures[f"jobs_{count}_rows_after_two_runs"] = list(rows)
        figures[f"jobs_{count}_archive_wall_s_first"] = round(walls[0], 2)
        figures[f"jobs_{count}_archive_wall_s_again"] = round(walls[1], 2)
        # every run's CPU (the first into an empty archive): the least is the cost
        figures[f"jobs_{count}_archive_cpu_s"] = [round(c, 3) for c in cpus]
        figures[f"jobs_{count}_archive_cpu_s_least"] = round(min(cpus), 3)
    figures["queries_independent_of_jobs"] = len(queries) == 1
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=("store", "prometheus", "all"), default="all")
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--prometheus-jobs", default="100,10000")
    parser.add_argument("--runs", type=int, default=2,
                        help="archive runs per job count (CPU: the least of them)")
    parser.add_argument("--source", default="",
                        help="time the slurm-gpu-report of this checkout (a before/after)")
    parser.add_argument("--tag", default="", help="write results/archive_<tag>.json")
    args = parser.parse_args()
    if args.source:  # its package ahead of the installed one (-P: not the working directory)
        global REPORT
        os.environ["PYTHONPATH"] = str(Path(args.source).resolve())
        REPORT = [sys.executable, "-P", "-c", "import sys; from slurm_gpu_exporter.report.cli.main "
                  "import main; sys.exit(main())"]
    name = f"archive_{args.tag}" if args.tag else "archive"
    work = Path(tempfile.mkdtemp(prefix="bench-archive-"))
    figures: dict[str, object] = {}
    previous = RESULTS / f"{name}.json"
    if args.part != "all" and previous.exists():
        import json

        kept = json.loads(previous.read_text())
        figures.update({k: v for k, v in kept.items()
                        if k not in ("benchmark", "when", "machine")})
    try:
        if args.part in ("store", "all"):
            figures.update({f"store_{k}": v for k, v in bench_store(args.jobs, work).items()})
        if args.part in ("prometheus", "all"):
            counts = [int(c) for c in args.prometheus_jobs.split(",")]
            figures.update({f"prometheus_{k}": v
                            for k, v in bench_prometheus(counts, work, args.runs).items()})
        load = Path("/proc/loadavg").read_text().split()[:3]
        figures["loadavg"] = " ".join(load)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    record(name, figures)


if __name__ == "__main__":
    main()
