"""The central commands against the long-term store at 10,000 and 100,000 jobs.

The fleet simulator's exposition (the agent's own code) of N nodes of 8 GPUs and 32 jobs
each, at 4 times 15 minutes apart over the last 45 minutes, is imported into a fresh
VictoriaMetrics (``/api/v1/import/prometheus``, each node with its ``instance``, ``job``
and ``cluster`` labels as a scrape would add them). Then, against the store, timed end to
end: ``slurm-gpu-report low-util --since 2h``, ``job`` of 20 jobs, and ``enforce
--format json`` (a dry run of a policy with a 60 and a 120 minute window: 11 queries),
Slurm's running jobs coming from a stand-in ``squeue --json`` that lists every simulated
job running at the end (its parse is part of the run, as a real one's would be); and,
for comparison with earlier runs, enforce's instant queries one after another. Load
average and a fixed Python loop are kept with the figures.

    .venv/bin/python bench/store_backfill.py [--jobs 10000,100000]
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import stat
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import record
from bench.scale_out import du, yardstick
from slurm_gpu_exporter.exposition.rendered import Exposition
from slurm_gpu_exporter.sim.fleet import FleetMix, slot_jobs, snapshot
from tests.system.observe.topology import VM_FLAGS, VictoriaMetrics

REPORT = Path(sys.executable).parent / "slurm-gpu-report"
JOBS_PER_NODE = 32
STEPS = (45 * 60, 30 * 60, 15 * 60, 0)
ENFORCE_POLICY = """
[idle]
warn_after = ["60m"]
cancel_after = "120m"
"""


def _timestamped(body: bytes, ms: int) -> bytes:
    suffix = f" {ms}".encode()
    return b"\n".join(line + suffix if line and not line.startswith(b"#") else line
                      for line in body.split(b"\n"))


def backfill(store: VictoriaMetrics, nodes: int, now: float) -> dict[str, float]:
    mix = FleetMix(nodes=nodes, jobs_per_node=JOBS_PER_NODE, epoch=now - 3600)
    start, cpu0 = time.perf_counter(), time.process_time()
    samples = 0
    for node in range(nodes):
        labels = urllib.parse.urlencode([
            ("extra_label", f"instance=gpu{node:05d}:9817"),
            ("extra_label", "job=slurm-gpu-exporter"), ("extra_label", "cluster=mycluster")])
        parts = []
        for back in STEPS:
            t = now - back
            body = Exposition(snapshot(mix, node, t)).text
            samples += sum(1 for line in body.split(b"\n") if line and not line.startswith(b"#"))
            parts.append(_timestamped(body, int(t * 1000)))
        request = urllib.request.Request(
            f"{store.url}/api/v1/import/prometheus?{labels}", data=b"\n".join(parts),
            method="POST")
        with urllib.request.urlopen(request, timeout=60) as resp:
            assert resp.status in (200, 204), resp.status
    return {"nodes": nodes, "samples": samples,
            "import_wall_s": round(time.perf_counter() - start, 1),
            "render_cpu_s": round(time.process_time() - cpu0, 1)}


def _enforce_queries() -> dict[str, str]:
    for idle, queries in (("slurm_gpu_exporter.report.enforce.idle_window",
                           "slurm_gpu_exporter.report.prometheus.queries"),
                          ("slurm_gpu_exporter.report.idle_window",
                           "slurm_gpu_exporter.report.queries")):
        try:
            window, filters = importlib.import_module(idle), importlib.import_module(queries)
        except ImportError:
            continue
        return window.idle_queries((3600.0, 7200.0), filters.Filters())
    raise SystemExit("enforce's idle_queries moved: update bench/store_backfill.py")


def timed_report(url: str, *args: str) -> dict[str, object]:
    start = time.perf_counter()
    run = subprocess.run([str(REPORT), *args, "--prometheus-url", url, "--format", "json"],
                         capture_output=True, text=True, timeout=1200, check=False)
    out: dict[str, object] = {"seconds": round(time.perf_counter() - start, 2),
                              "rc": run.returncode}
    if run.returncode == 0 and args[0] == "low-util":
        out["jobs_seen"] = json.loads(run.stdout)["jobs_seen"]
    elif run.returncode:
        out["stderr"] = run.stderr[-300:]
    return out


def squeue_stand_in(mix: FleetMix, now: float, where: Path) -> Path:
    """A directory holding a ``squeue`` that prints every job running at ``now`` as
    ``squeue --json`` (23.11's shape) would."""
    jobs = []
    for node in range(mix.nodes):
        for job in slot_jobs(mix, node, now):
            if job.end is not None:
                continue
            info = job.info
            jobs.append({"job_id": int(info.jobid), "user_name": info.user,
                         "account": info.account, "partition": info.partition,
                         "qos": info.qos, "name": info.name, "job_state": ["RUNNING"],
                         "start_time": {"set": True, "number": int(job.start)},
                         "job_resources": {"nodes": {"allocation": [
                             {"name": f"gpu{node:05d}"}]}},
                         "tres_alloc_str": f"cpu=8,gres/gpu={len(job.devices)}"})
    bin_dir = where / "bin"
    bin_dir.mkdir(exist_ok=True)
    (where / "squeue.json").write_text(json.dumps({"jobs": jobs}))
    script = bin_dir / "squeue"
    script.write_text(f"#!/bin/sh\nexec cat {where / 'squeue.json'}\n")
    script.chmod(stat.S_IRWXU)
    return bin_dir


def timed_enforce(url: str, where: Path, bin_dir: Path) -> dict[str, object]:
    policy = where / "policy.toml"
    policy.write_text(ENFORCE_POLICY)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    start = time.perf_counter()
    run = subprocess.run([str(REPORT), "enforce", "--policy", str(policy), "--format", "json",
                          "--prometheus-url", url, "--state-file", str(where / "enforce.json")],
                         capture_output=True, text=True, timeout=1200, check=False, env=env)
    out: dict[str, object] = {"seconds": round(time.perf_counter() - start, 2),
                              "rc": run.returncode}
    if run.returncode in (0, 7):  # 7: some jobs doubtful (no `up` series were imported)
        answer = json.loads(run.stdout)
        out["decisions"] = len(answer["decisions"])
        out["queries"] = answer["queries"]
    else:
        out["stderr"] = run.stderr[-300:]
    return out


def timed_queries(url: str, queries: dict[str, str]) -> dict[str, object]:
    start = time.perf_counter()
    series = 0
    for query in queries.values():
        body = urllib.parse.urlencode({"query": query}).encode()
        with urllib.request.urlopen(f"{url}/api/v1/query", data=body, timeout=600) as resp:
            series += len(json.load(resp)["data"]["result"])
    return {"seconds": round(time.perf_counter() - start, 2), "queries": len(queries),
            "series_returned": series}


def run(jobs: int, reuse: Path | None = None, flags: tuple[str, ...] = ()) -> dict[str, object]:
    """Import ``jobs`` jobs into a new store (or start one on the data of an earlier run,
    ``reuse``, with more ``flags``) and time the commands on it."""
    nodes = jobs // JOBS_PER_NODE
    base = reuse or Path(tempfile.mkdtemp(prefix="store-backfill-"))
    store = VictoriaMetrics(base / "vm", VM_FLAGS + flags)
    try:
        store.wait_ready()
        out: dict[str, object] = {"jobs": jobs, "load_before": list(os.getloadavg()),
                                  "data": str(base), "store_flags": list(VM_FLAGS + flags)}
        now = time.time() - 60  # past the store's latency offset
        if reuse is None:
            out["backfill"] = backfill(store, nodes, now)
            urllib.request.urlopen(f"{store.url}/internal/force_flush", timeout=120).read()
            time.sleep(5)
        out["disk_bytes"] = du(base / "vm" / "data")
        ids = [str(1_000_000 + (n * JOBS_PER_NODE) * 10_000) for n in range(0, nodes,
                                                                              max(1, nodes // 20))]
        out["low_util_2h"] = timed_report(store.url, "low-util", "--since", "2h")
        out["job_x20"] = timed_report(store.url, "job", *ids[:20], "--since", "2h",
                                      "--no-sacct")
        bin_dir = squeue_stand_in(FleetMix(nodes=nodes, jobs_per_node=JOBS_PER_NODE,
                                           epoch=now - 3600), now, base)
        out["enforce"] = timed_enforce(store.url, base, bin_dir)
        out["enforce_queries"] = timed_queries(store.url, _enforce_queries())
        out["load_after"] = list(os.getloadavg())
        if any(isinstance(v, dict) and v.get("rc") for v in out.values()):
            out["store_log"] = [line[-400:] for line in store.log().splitlines()
                                if "concurrent" in line or "error" in line][-3:]
        return out
    finally:
        store.stop()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--jobs", default="10000,100000")
    p.add_argument("--reuse", type=Path, help="the data of an earlier run (one --jobs)")
    p.add_argument("--vm-flag", action="append", default=[], help="more store flags")
    p.add_argument("--tag", default="", help="write results/store_backfill_<tag>.json")
    a = p.parse_args()
    figures: dict[str, object] = {"yardstick_s_before": yardstick()}
    for jobs in (int(x) for x in a.jobs.split(",")):
        figures[f"jobs_{jobs}"] = run(jobs, a.reuse, tuple(a.vm_flag))
        print(jobs, figures[f"jobs_{jobs}"], flush=True)
    figures["yardstick_s_after"] = yardstick()
    record("store_backfill" + (f"_{a.tag}" if a.tag else ""), figures)


if __name__ == "__main__":
    main()
