"""Sizing of the scale-out recipe (issue 35): series per node and job, what a shard and
the long-term store cost per 100k series, and the central commands' run time on the store.

1. Series per node: the fleet simulator's exposition (the agent's own code) at 8 GPUs with
   1, 8, 32 and 1,000 jobs, a MIG node, and a job name of 10,000 characters.
2. Live: the fleet of N nodes (8 GPUs, 8 jobs each, 8 job starts per node and hour),
   scraped every --interval by one Prometheus and by two shards remote-writing to
   VictoriaMetrics (tests/system/observe/topology.py: the shipped scale-out config). After a
   warm-up, over --window seconds: each daemon's CPU (/proc/<pid>/stat) and RSS, head
   series and samples appended, the recording rules' evaluation time, the store's rows
   inserted and bytes on disk. Then ``low-util --since 1h`` and a ``job`` report of 20
   jobs against one Prometheus and against the store, timed end to end.

The machine's load average and a fixed Python loop (the yardstick, timed in the same
run) are kept with every figure: on a shared machine compare runs by the yardstick.

    .venv/bin/python bench/scale_out.py --nodes 250,1000 [--interval 30] [--window 150]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import record
from slurm_gpu_exporter.sim.fleet import FleetMix
from slurm_gpu_exporter.sim.fleet_server import Fleet
from tests.system.observe.topology import topologies

TICK = os.sysconf("SC_CLK_TCK")
REPORT = Path(sys.executable).parent / "slurm-gpu-report"


def yardstick() -> float:
    """Seconds of a fixed pure-Python loop: the machine's speed in this run."""
    start = time.perf_counter()
    total = 0
    for i in range(2_000_000):
        total += i * i
    return round(time.perf_counter() - start, 3)


def samples_in(body: bytes) -> int:
    return sum(1 for line in body.split(b"\n") if line and not line.startswith(b"#"))


def families_of_job(body: bytes) -> dict[str, int]:
    """Series per family among a node's samples that carry a ``jobid``."""
    counts: dict[str, int] = {}
    for line in body.split(b"\n"):
        if line and not line.startswith(b"#") and b'jobid="' in line:
            name = line.split(b"{", 1)[0].decode()
            counts[name] = counts.get(name, 0) + 1
    return dict(sorted(counts.items()))


def series_per_node() -> dict[str, object]:
    now = time.time()
    out: dict[str, object] = {}
    for jobs in (1, 8, 32, 1000):
        fleet = Fleet(FleetMix(nodes=1, jobs_per_node=jobs, epoch=now - 600))
        n = samples_in(fleet.body(0, now))
        empty = samples_in(Fleet(FleetMix(nodes=1, jobs_per_node=0, epoch=now)).body(0, now))
        out[f"8gpu_{jobs}jobs"] = {"series": n, "per_job": round((n - empty) / jobs, 1)}
    out["8gpu_0jobs"] = {"series": empty}
    one = Fleet(FleetMix(nodes=1, jobs_per_node=1, epoch=now - 600)).body(0, now)
    out["1job_8gpus_by_family"] = families_of_job(one)
    mig = Fleet(FleetMix(nodes=1, mig_share=1.0, epoch=now - 600))
    out["8gpu_mig7_8jobs"] = {"series": samples_in(mig.body(0, now))}
    long_name = Fleet(FleetMix(nodes=1, name_pad=10_000, epoch=now - 600)).body(0, now)
    out["name_10000_chars"] = {"bytes_per_scrape": len(long_name),
                               "longest_line": max(map(len, long_name.split(b"\n")))}
    return out


def proc(pid: int) -> tuple[float, int]:
    """CPU seconds and RSS bytes of a process."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / TICK
    rss = next(int(line.split()[1]) * 1024 for line in
               Path(f"/proc/{pid}/status").read_text().splitlines() if line.startswith("VmRSS"))
    return cpu, rss


def scrape(url: str) -> dict[str, float]:
    """A daemon's own /metrics, summed by family name (labels dropped); ``max:<name>``
    holds the largest single series of each name."""
    with urllib.request.urlopen(url + "/metrics", timeout=30) as resp:
        text = resp.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name = line.split("{", 1)[0].split(" ", 1)[0]
            try:
                value = float(line.rsplit(" ", 1)[1])
                out[name] = out.get(name, 0.0) + value
                out[f"max:{name}"] = max(out.get(f"max:{name}", value), value)
                if name == "prometheus_rule_group_last_duration_seconds":
                    group = line.split('rule_group="', 1)[1].split('"', 1)[0].rsplit(";", 1)[-1]
                    out[f"group:{group}"] = value
            except ValueError:
                pass
    return out


def du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def flush(url: str) -> None:
    """Make VictoriaMetrics write what it holds in memory to disk."""
    urllib.request.urlopen(f"{url}/internal/force_flush", timeout=120).read()
    time.sleep(2)


def timed(url: str, *args: str) -> dict[str, object]:
    start = time.perf_counter()
    run = subprocess.run([str(REPORT), *args, "--prometheus-url", url, "--format", "json"],
                         capture_output=True, text=True, timeout=600, check=False)
    return {"seconds": round(time.perf_counter() - start, 2), "rc": run.returncode,
            "bytes": len(run.stdout)}


def live(nodes: int, interval: int, window: int) -> dict[str, object]:
    base = Path(tempfile.mkdtemp(prefix="scale-out-"))
    fleet = ["--nodes", str(nodes), "--churn-per-hour", "8", "--sample-interval", "5"]
    with topologies(base, fleet, interval=f"{interval}s") as tops:
        daemons = {"one": tops.one, "shard0": tops.shards[0], "shard1": tops.shards[1],
                   "store": tops.store, "fleet": tops.fleet}
        time.sleep(3 * interval + 10)  # every target scraped, every rule evaluated
        flush(tops.store.url)
        disk0 = du(base / "vm" / "data")
        before = {n: proc(d.proc.pid) for n, d in daemons.items()}
        metrics0 = {n: scrape(d.url) for n, d in daemons.items() if n != "fleet"}
        load0 = os.getloadavg()
        time.sleep(window)
        after = {n: proc(d.proc.pid) for n, d in daemons.items()}
        metrics1 = {n: scrape(d.url) for n, d in daemons.items() if n != "fleet"}
        out: dict[str, object] = {"nodes": nodes, "interval_s": interval, "window_s": window,
                                  "load_before": [round(x, 2) for x in load0],
                                  "load_after": [round(x, 2) for x in os.getloadavg()]}
        for name in ("one", "shard0", "shard1"):
            m0, m1 = metrics0[name], metrics1[name]
            series = m1["prometheus_tsdb_head_series"]
            cpu = after[name][0] - before[name][0]
            appended = (m1["prometheus_tsdb_head_samples_appended_total"]
                        - m0["prometheus_tsdb_head_samples_appended_total"])
            out[name] = {
                "head_series": int(series), "samples_per_s": round(appended / window, 1),
                "cpu_cores": round(cpu / window, 4), "rss_mib": round(after[name][1] / 2**20, 1),
                "cpu_cores_per_100k_series": round(cpu / window / series * 1e5, 4),
                "rss_mib_per_100k_series": round(after[name][1] / 2**20 / series * 1e5, 1),
                "rule_eval_s_per_interval": round(m1.get(
                    "prometheus_rule_group_last_duration_seconds", 0.0), 4),
                "slowest_rule_group_s": round(m1.get(
                    "max:prometheus_rule_group_last_duration_seconds", 0.0), 4),
                "rule_group_s": {k.removeprefix("group:"): round(v, 3)
                                 for k, v in m1.items() if k.startswith("group:")},
                "rule_iterations_missed": m1.get(
                    "prometheus_rule_group_iterations_missed_total", 0.0) - m0.get(
                    "prometheus_rule_group_iterations_missed_total", 0.0),
                "remote_write_samples_failed": m1.get(
                    "prometheus_remote_storage_samples_failed_total", 0.0)}
        m0, m1 = metrics0["store"], metrics1["store"]
        rows = m1.get("vm_rows_inserted_total", 0.0) - m0.get("vm_rows_inserted_total", 0.0)
        cpu = after["store"][0] - before["store"][0]
        flush(tops.store.url)
        disk = du(base / "vm" / "data")
        out["store"] = {
            "bytes_per_sample_in_window": round((disk - disk0) / rows, 2) if rows else None,
            "rows_per_s": round(rows / window, 1), "cpu_cores": round(cpu / window, 4),
            "rows_per_s_per_core": round(rows / cpu, 0) if cpu else None,
            "rss_mib": round(after["store"][1] / 2**20, 1), "disk_bytes": disk,
            "rows_total": m1.get("vm_rows_inserted_total", 0.0),
            "bytes_per_sample_on_disk": round(disk / max(1.0, m1.get(
                "vm_rows_inserted_total", 1.0)), 2)}
        out["fleet"] = {"cpu_cores": round((after["fleet"][0] - before["fleet"][0]) / window, 4),
                        "rss_mib": round(after["fleet"][1] / 2**20, 1)}
        jobs = sorted({s["metric"]["jobid"] for s in tops.one.vector("slurm_job_info")})
        out["jobs_seen"] = len(jobs)
        ids = jobs[:: max(1, len(jobs) // 20)][:20]
        for name, url in (("one", tops.one.url), ("store", tops.store.url)):
            out[f"low_util_1h_{name}"] = timed(url, "low-util", "--since", "1h")
            out[f"job_x20_{name}"] = timed(url, "job", *ids, "--since", "1h", "--no-sacct")
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--nodes", default="250,1000")
    p.add_argument("--interval", type=int, default=30)
    p.add_argument("--window", type=int, default=150)
    p.add_argument("--tag", default="", help="write results/scale_out_<tag>.json")
    p.add_argument("--series-only", action="store_true",
                   help="only the series per node and job (no daemons: seconds)")
    a = p.parse_args()
    figures: dict[str, object] = {"yardstick_s_before": yardstick(),
                                  "load_start": [round(x, 2) for x in os.getloadavg()],
                                  "series_per_node": series_per_node()}
    for n in (int(x) for x in ([] if a.series_only else a.nodes.split(","))):
        figures[f"live_{n}"] = live(n, a.interval, a.window)
        print(n, figures[f"live_{n}"], flush=True)
    figures["yardstick_s_after"] = yardstick()
    record("scale_out" + (f"_{a.tag}" if a.tag else ""), figures)


if __name__ == "__main__":
    main()
