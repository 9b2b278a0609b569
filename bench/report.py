"""slurm-gpu-report low-util over 7 days of 10,000 jobs in a real Prometheus.

Writes synthetic agent metrics (the families low-util reads, every 60 s, as the
agent exposes them) into TSDB blocks with ``promtool tsdb create-blocks-from
openmetrics``, starts Debian's Prometheus over them (no scraping), and times
``slurm-gpu-report low-util --since 7d`` end to end (process start to exit), then
``slurm-gpu-report job`` of 20 of the flagged jobs over the same window.
Run for 100 and 10,000 jobs: the number of PromQL queries must be the same.

    .venv/bin/python bench/report.py [--jobs 100,10000] [--runs 3] [--tag before]
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import record
from tests.support import free_port

REPORT = str(Path(sys.executable).parent / "slurm-gpu-report")
DAYS = 7
STEP_S = 60  # scrape interval of the synthetic data
BLOCK_S = 2 * 3600  # promtool makes 2 h blocks; one input file per block keeps it to one pass
NODES = 400
USERS = [f"user{i:03d}" for i in range(300)]
ACCOUNTS = [f"acct{i:02d}" for i in range(40)]


@dataclass
class Job:
    jobid: int
    user: str
    account: str
    start: float
    end: float
    gpus: int
    nodes: list[str]
    ratio: float  # busy share of the GPUs it uses
    used_gpus: int

    def instances(self) -> list[str]:
        return [f"{n}:9400" for n in self.nodes]


def make_jobs(count: int, end: float, seed: int = 1) -> list[Job]:
    rng = random.Random(seed)
    start = end - DAYS * 86400
    jobs = []
    for i in range(count):
        duration = min(86400.0, max(600.0, rng.lognormvariate(8.3, 0.9)))  # median ~1.1 h
        begin = rng.uniform(start - 3600, end - 600)
        gpus = rng.choice([1, 1, 1, 2, 2, 4, 8])
        nodes = 2 if gpus == 8 and rng.random() < 0.5 else 1
        user = rng.choice(USERS)
        ratio = rng.choice([0.0, 0.05, 0.1, 0.2]) if rng.random() < 0.25 else rng.uniform(0.3, 1)
        jobs.append(Job(
            jobid=1_000_000 + i, user=user, account=ACCOUNTS[hash(user) % len(ACCOUNTS)],
            start=begin, end=min(end, begin + duration), gpus=gpus,
            nodes=[f"gpu{n:03d}" for n in rng.sample(range(NODES), nodes)], ratio=ratio,
            used_gpus=gpus if rng.random() < 0.8 else max(0, gpus // 2)))
    return jobs


def _block_text(jobs: list[Job], lo: float, hi: float) -> tuple[str, int]:
    """OpenMetrics text of the samples in [lo, hi), grouped by family, and their count."""
    families: dict[str, list[str]] = {name: [] for name in (
        "slurm_job_info", "slurm_job_gpus", "slurm_job_start_time_seconds",
        "slurm_job_end_time_seconds", "slurm_job_gpu_allocated_seconds",
        "slurm_job_gpu_busy_seconds", "slurm_job_gpu_memory_peak_bytes")}
    for job in jobs:
        first = max(lo, job.start - job.start % STEP_S + STEP_S)
        if first >= hi or job.end + 300 < lo:
            continue
        times = []
        t = first - (first - job.start) % STEP_S if first > job.start else first
        while t < min(hi, job.end + 300):  # series linger 5 min after the end
            if t >= lo:
                times.append(t)
            t += STEP_S
        if not times:
            continue
        per_node = job.gpus // len(job.nodes)
        for n, instance in enumerate(job.instances()):
            base = f'instance="{instance}",job="slurm-gpu",jobid="{job.jobid}",user="{job.user}"'
            info = (f'slurm_job_info{{account="{job.account}",{base},name="job{job.jobid}",'
                    f'partition="gpu"}}')
            for t in times:
                families["slurm_job_info"].append(f"{info} 1 {t:.0f}")
            for t in times:
                families["slurm_job_gpus"].append(f"slurm_job_gpus{{{base}}} {per_node} {t:.0f}")
            for t in times:
                families["slurm_job_start_time_seconds"].append(
                    f"slurm_job_start_time_seconds{{{base}}} {job.start:.0f} {t:.0f}")
            for t in (t for t in times if t >= job.end):
                families["slurm_job_end_time_seconds"].append(
                    f"slurm_job_end_time_seconds{{{base}}} {job.end:.0f} {t:.0f}")
            for g in range(per_node):
                used = n * per_node + g < job.used_gpus
                gl = f'{base},gpu="{g}",uuid="GPU-{instance[:6]}-{g}"'
                for t in times:
                    held = min(t, job.end) - job.start
                    families["slurm_job_gpu_allocated_seconds"].append(
                        f"slurm_job_gpu_allocated_seconds_total{{{gl}}} {held:.3f} {t:.0f}")
                for t in times:
                    busy = (min(t, job.end) - job.start) * job.ratio if used else 0.0
                    families["slurm_job_gpu_busy_seconds"].append(
                        f"slurm_job_gpu_busy_seconds_total{{{gl}}} {busy:.3f} {t:.0f}")
                peak = (8 + 60 * job.ratio) * 2**30 if used else 0
                for t in times:
                    families["slurm_job_gpu_memory_peak_bytes"].append(
                        f"slurm_job_gpu_memory_peak_bytes{{{gl}}} {peak:.0f} {t:.0f}")
    out = []
    for name, lines in families.items():
        if not lines:
            continue
        kind = "counter" if name.endswith("_seconds") and "gpu_" in name else "gauge"
        out.append(f"# TYPE {name} {kind}")
        out.extend(lines)
    out.append("# EOF")
    return "\n".join(out) + "\n", sum(len(lines) for lines in families.values())


def build_tsdb(jobs: list[Job], end: float, work: Path) -> tuple[Path, int]:
    """TSDB blocks of the jobs' metrics; returns the directory and the sample count."""
    data = work / "data"
    data.mkdir()
    lo0 = (end - DAYS * 86400 - 3600) // BLOCK_S * BLOCK_S
    ranges = []
    t = lo0
    while t < end + 600:
        ranges.append((t, t + BLOCK_S))
        t += BLOCK_S

    def one(block: tuple[float, float]) -> int:
        text, samples = _block_text(jobs, *block)
        if samples:
            path = work / f"block-{block[0]:.0f}.om"
            path.write_text(text)
            # Each run writes into a directory of its own; its blocks then join the rest.
            out = work / f"out-{block[0]:.0f}"
            proc = subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics",
                                   "-q", str(path), str(out)], capture_output=True, text=True,
                                  check=False)
            if proc.returncode != 0:
                raise RuntimeError(f"promtool failed on {path.name}: {proc.stderr.strip()}")
            for made in out.iterdir():
                made.rename(data / made.name)
            out.rmdir()
            path.unlink()
        return samples

    with ThreadPoolExecutor(2) as pool:
        total = sum(pool.map(one, ranges))
    return data, total


def start_prometheus(data: Path, work: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    config = work / "prometheus.yml"
    config.write_text("global: {scrape_interval: 60s}\n")
    proc = subprocess.Popen(
        ["prometheus", f"--config.file={config}", f"--storage.tsdb.path={data}",
         "--storage.tsdb.retention.time=30d", f"--web.listen-address=127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL, stderr=(work / "prometheus.log").open("wb"))
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + "/-/ready", timeout=2) as resp:
                if resp.status == 200:
                    return proc, url
        except OSError:
            time.sleep(0.5)
    proc.terminate()
    raise RuntimeError("prometheus did not become ready: " +
                       (work / "prometheus.log").read_text()[-2000:])


def run_report(url: str, end: float) -> tuple[float, dict]:  # type: ignore[type-arg]
    started = time.monotonic()
    out = subprocess.run([REPORT, "low-util", "--since", f"{DAYS}d", "--end", f"{end:.0f}",
                          "--prometheus-url", url, "--format", "json", "--timeout", "120"],
                         capture_output=True, text=True, check=False)
    wall = time.monotonic() - started
    if out.returncode != 0:
        raise RuntimeError(out.stderr)
    return wall, json.loads(out.stdout)


def run_job(url: str, end: float, jobids: list[str]) -> tuple[float, dict]:  # type: ignore[type-arg]
    started = time.monotonic()
    out = subprocess.run([REPORT, "job", *jobids, "--since", f"{DAYS}d", "--end", f"{end:.0f}",
                          "--prometheus-url", url, "--format", "json", "--no-sacct",
                          "--timeout", "120"], capture_output=True, text=True, check=False)
    wall = time.monotonic() - started
    if out.returncode != 0:
        raise RuntimeError(out.stderr)
    return wall, json.loads(out.stdout)


def bench(count: int, runs: int) -> dict[str, object]:
    end = float(int(time.time()) // 60 * 60 - 600)
    jobs = make_jobs(count, end)
    with tempfile.TemporaryDirectory(prefix="sge-report-bench-") as tmp:
        work = Path(tmp)
        t0 = time.monotonic()
        data, samples = build_tsdb(jobs, end, work)
        build_s = time.monotonic() - t0
        proc, url = start_prometheus(data, work)
        try:
            run_report(url, end)  # warm the page cache, as a weekly cron on a live server is
            walls, result = [], {}
            for _ in range(runs):
                wall, result = run_report(url, end)
                walls.append(wall)
            # `job` of 20 flagged jobs (their ids as Prometheus labels them)
            jobids = sorted(j["job"] for j in result["flagged"])[:20]
            run_job(url, end, jobids)
            job_walls, job_result = [], {}
            for _ in range(runs):
                wall, job_result = run_job(url, end, jobids)
                job_walls.append(wall)
        finally:
            proc.terminate()
            proc.wait(30)
    print(f"{count} jobs: {samples} samples, blocks built in {build_s:.0f} s, "
          f"low-util {statistics.median(walls):.2f} s, {result['queries']} queries, "
          f"{len(result['flagged'])} flagged of {result['jobs_seen']}", flush=True)
    return {"jobs": count, "jobs_seen": result["jobs_seen"], "flagged": len(result["flagged"]),
            "samples": samples, "queries": result["queries"],
            "low_util_wall_s_median": round(statistics.median(walls), 2),
            "low_util_wall_s_max": round(max(walls), 2),
            "job_jobs": len(jobids), "job_queries": job_result["queries"],
            "job_wall_s_median": round(statistics.median(job_walls), 2),
            "job_wall_s_max": round(max(job_walls), 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", default="100,10000")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--tag", default="", help="write results/report_<tag>.json")
    args = parser.parse_args()
    if not shutil.which("promtool") or not shutil.which("prometheus"):
        sys.exit("bench/report.py needs Debian's prometheus package (prometheus, promtool)")
    results = [bench(int(n), args.runs) for n in args.jobs.split(",")]
    figures: dict[str, object] = {"window_days": DAYS, "scrape_interval_s": STEP_S,
                                  "budget_s": 10}
    for res in results:
        n = res.pop("jobs")
        for key, value in res.items():
            figures[f"jobs_{n}_{key}"] = value
    figures["queries_independent_of_jobs"] = len({r["queries"] for r in results}) == 1
    record(f"report_{args.tag}" if args.tag else "report", figures)


if __name__ == "__main__":
    main()
