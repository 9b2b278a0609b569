"""Real-Slurm scaling: the agent on the one-node test cluster at 0..128 jobs.

The cluster is scripts/slurm-testcluster's (Debian's Slurm, cgroup v1, the repo's
prolog/epilog). Each job is one ``sleep`` (``--mem=32M``); the first four hold one GPU
each, and the fake NVML shows each of their sleeps on its GPU. The partition's
OverSubscribe is raised for the run (``scontrol update``, put back at the end) so
that 128 one-CPU jobs fit on a 2-core machine. The agent runs at
``--sample-interval 5`` with ``--slurm-lookup cli``, as the integration tests run it.

For each job count: agent CPU per sample with no scrapes (agent process CPU over the
window / samples), CPU of a scrape (first of a snapshot, and repeated), RSS and
series count; at 64 jobs also the agent's CPU share of a core over 5 minutes with a
scrape every 30 s. Holds the tests' Slurm lock (/var/tmp/sge-testcluster.lock) for the
whole run and stops the cluster at the end (when it started it).

    .venv/bin/python bench/slurm_scale.py [--window 40] [--levels 0,1,8,32,64,128]
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from agentproc import (  # noqa: E402
    PROMETHEUS_HEADERS,
    by_thread,
    cpu_seconds,
    get,
    idle_cpu_per_sample,
    load,
    rss_mib,
    scrape_cpu,
    series_count,
    thread_cpu,
)
from common import record, yardstick  # noqa: E402

from tests.conftest import SLURM_LOCK as LOCK  # noqa: E402  (tests and bench take turns)
from tests.fakenvml import Device, FakeNvml, NvmlState, Pattern, Process  # noqa: E402
from tests.support.agent import Agent  # noqa: E402
from tests.support.slurmcluster import SlurmCluster, unavailable_reason  # noqa: E402

INTERVAL = 5.0
GPU_JOBS = 4
_RUNNING = re.compile(rb'^slurm_gpu_exporter_jobs\{state="running"\} (\S+)$', re.M)


def running_in_agent(url: str) -> int:
    m = _RUNNING.search(get(url + "/metrics"))
    return int(float(m.group(1))) if m else -1


def sleep_pid(cluster: SlurmCluster, jobid: int, timeout: float = 60.0) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for pid in cluster.job_pids(jobid, "batch"):
            with contextlib.suppress(OSError):
                if Path(f"/proc/{pid}/comm").read_text().strip() == "sleep":
                    return pid
        time.sleep(0.1)
    raise TimeoutError(f"job {jobid} has no sleep process")


def wait_running(cluster: SlurmCluster, count: int, timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        out = cluster.run(["squeue", "-h", "-t", "R", "-o", "%A"], check=False)
        running = len(out.split())
        if running >= count:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{running} of {count} jobs running after {timeout} s:\n"
                               + cluster.run(["squeue"], check=False))
        time.sleep(0.5)


def wait_agent_sees(url: str, count: int, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while running_in_agent(url) != count:
        if time.monotonic() > deadline:
            raise TimeoutError(f"the agent sees {running_in_agent(url)} running jobs, "
                               f"not {count}")
        time.sleep(1.0)


_INFO = re.compile(rb'^slurm_job_info\{(.*)\} ', re.M)


def wait_looked_up(url: str, count: int, timeout: float = 300.0) -> None:
    """Until Slurm's answer is in for every job: the prolog never knows a job's name,
    and the agent asks Slurm about at most 8 new jobs per sample, so 64 new jobs take
    8 samples. Those look-ups happen once in a job's life; the figures are of the
    samples after them."""
    deadline = time.monotonic() + timeout
    while True:
        labels = _INFO.findall(get(url + "/metrics"))
        named = sum(1 for text in labels if b'name=""' not in text)
        if named >= count:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{named} of {count} jobs looked up in Slurm")
        time.sleep(1.0)


def cpu_share(pid: int, url: str, seconds: float, scrape_every: float) -> dict[str, object]:
    """The agent's CPU share of a core over ``seconds``, scraped as Prometheus would
    (OpenMetrics, gzip) every ``scrape_every`` seconds."""
    la0, threads0, cpu0 = load(), thread_cpu(pid), cpu_seconds(pid)
    start = time.monotonic()
    scrapes = 0
    while (left := seconds - (time.monotonic() - start)) > 0:
        get(url + "/metrics", PROMETHEUS_HEADERS)
        scrapes += 1
        time.sleep(min(scrape_every, left))
    elapsed = time.monotonic() - start
    cpu, threads1 = cpu_seconds(pid) - cpu0, thread_cpu(pid)
    samples = max(1, round(elapsed / INTERVAL))
    return {"seconds": round(elapsed), "scrapes": scrapes,
            "cpu_share_of_core_pct": round(cpu / elapsed * 100, 3),
            "cpu_ms_per_sample_incl_scrapes": round(cpu * 1000 / samples, 2),
            "cpu_ms_per_sample_by_thread": by_thread(pid, threads0, threads1, cpu, samples),
            "load_1m": round((la0 + load()) / 2, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--window", type=float, default=40.0)
    parser.add_argument("--levels", default="0,1,8,32,64,128")
    parser.add_argument("--tag", default="", help="suffix of the results file (before/after)")
    parser.add_argument("--share-at", type=int, default=64,
                        help="job count at which to measure the CPU share with scrapes")
    parser.add_argument("--share-seconds", type=float, default=300.0,
                        help="how long (0: not at all)")
    parser.add_argument("--scrape-every", type=float, default=30.0)
    parser.add_argument("--profile-at", type=int, default=-1,
                        help="job count at which to run cycle_profile.py over the same jobs, "
                             "profiled and not (results/cycle_profile_slurm<N>[_<tag>][_timed]"
                             ".json); -1: none")
    parser.add_argument("--idle-samples", action="store_true",
                        help="idle GPUs keep taking a sample every period (the fake's "
                             "idle_samples; default: an idle GPU's buffer answers NOT_FOUND)")
    args = parser.parse_args()
    levels = [int(x) for x in args.levels.split(",")]
    reason = unavailable_reason()
    if reason:
        sys.exit(f"slurm_scale: the test cluster cannot run here: {reason}")
    with open(LOCK, "a") as lock:
        print(f"waiting for {LOCK} ...", flush=True)
        fcntl.flock(lock, fcntl.LOCK_EX)
        results = run(levels, args.window, (args.share_at, args.share_seconds, args.scrape_every),
                      idle_samples=args.idle_samples,
                      profile=(args.profile_at, f"slurm{args.profile_at}"
                               + (f"_{args.tag}" if args.tag else "")))
    figures: dict[str, object] = {
        "command": "python bench/slurm_scale.py " + " ".join(sys.argv[1:]),
        "cpus": os.cpu_count(),
        "sample_interval_s": INTERVAL,
        "window_s": args.window,
        "idle_samples": args.idle_samples,
        "levels": results,
    }
    empty = results.get("0", {}).get("cpu_ms_per_sample")
    for n in levels:
        if n and empty is not None:
            per = (results[str(n)]["cpu_ms_per_sample"] - empty) / n  # type: ignore[operator]
            results[str(n)]["cpu_ms_per_job_above_empty"] = round(per, 3)  # type: ignore[index]
    record("slurm_scale" + (f"_{args.tag}" if args.tag else ""), figures)


def run(levels: list[int], window: float, share: tuple[int, float, float],
        idle_samples: bool = False, profile: tuple[int, str] = (-1, "")
        ) -> dict[str, dict[str, object]]:
    cluster = SlurmCluster()
    started_here = not cluster.is_up()
    cluster.up()
    results: dict[str, dict[str, object]] = {}
    jobs: list[int] = []
    with tempfile.TemporaryDirectory(prefix="sge-bench-") as tmp:
        fake = FakeNvml(Path(tmp) / "nvml")
        devices = [Device(i) for i in range(4)]
        fake.write(NvmlState(devices=devices, idle_samples=idle_samples))
        cluster.run(["scontrol", "update", "PartitionName=debug", "OverSubscribe=FORCE:64"])
        agent = Agent(["--spool-dir", str(cluster.spool_dir), "--state-dir", f"{tmp}/state",
                       "--sample-interval", str(INTERVAL), "--slurm-lookup", "cli",
                       "--node-name", cluster.node_name],
                      env={**fake.env(), **cluster.env}, log_path=Path(tmp) / "agent.log")
        try:
            agent.wait_ready(60)
            for n in levels:
                t0 = time.monotonic()
                while len(jobs) < n:
                    gpu = len(jobs) < GPU_JOBS
                    jobs.append(cluster.submit("exec sleep 3600\n", gres="gpu:1" if gpu else None,
                                               extra_args=["--mem=32M"]))
                wait_running(cluster, n)
                for i, jobid in enumerate(jobs[:GPU_JOBS]):
                    pid = sleep_pid(cluster, jobid)  # after the prolog wrote the record
                    text = (cluster.spool_dir / f"{jobid}.json").read_text()
                    minor = int(json.loads(text)["job_gpus"])
                    devices[minor].processes = [Process(pid, 1 << 30,
                                                        sm=Pattern.square(2, 5, 50 + 10 * i))]
                fake.write(NvmlState(devices=devices, idle_samples=idle_samples))
                wait_agent_sees(agent.url, n)
                started = time.monotonic() - t0
                wait_looked_up(agent.url, n)
                time.sleep(INTERVAL)  # the sample after the last look-up
                pid = agent.proc.pid
                idle = idle_cpu_per_sample(pid, agent.url, INTERVAL, window)
                scrapes = scrape_cpu(pid, agent.url, INTERVAL, snapshots=4, repeat=20)
                results[str(n)] = {**idle, **scrapes, "rss_mib": round(rss_mib(pid), 1),
                                   "series": series_count(agent.url),
                                   "jobs_start_s": round(started, 1),
                                   "yardstick": yardstick()}
                if n == share[0] and share[1] > 0:
                    results[str(n)]["share_scraped_every_"
                                    f"{share[2]:g}s"] = cpu_share(pid, agent.url, share[1],
                                                                  share[2])
                print(n, results[str(n)], flush=True)
                if n == profile[0]:  # in process, over the same jobs; after the figures
                    for how in (["--tag", profile[1]], ["--no-profile", "--tag",
                                                        profile[1] + "_timed"]):
                        subprocess.run([sys.executable,
                                        str(Path(__file__).parent / "cycle_profile.py"),
                                        "--spool-dir", str(cluster.spool_dir),
                                        "--node-name", cluster.node_name, *how]
                                       + (["--idle-samples"] if idle_samples else []),
                                       env={**os.environ, **cluster.env}, check=False)
        finally:
            agent.stop()
            for jobid in jobs:
                cluster.cancel(jobid)
            cluster.run(["scontrol", "update", "PartitionName=debug", "OverSubscribe=FORCE:4"],
                        check=False)
            if started_here:
                cluster.down()
            print(f"load at end {load()}", flush=True)
    return results


if __name__ == "__main__":
    main()
