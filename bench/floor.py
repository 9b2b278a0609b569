"""The floor: the least a sample can cost on node-large, to judge the agent against.

A minimal loop over node_large.py's ``base`` node (64 jobs, 512 GPU processes,
4,000 other processes) that reads only the files a sample must read (per job its
cgroup accounting files and the pids of its task cgroup; per GPU process its
/proc/<pid>/stat, to check the pid's start time; the spool directory listing) and
then writes as many series in the text exposition format as the agent exposes
there. No NVML (the agent's budget leaves the driver's time out too).

The ratio compares the agent's CPU per sample (results/node_large_<tag>.json, its
sampler thread: no NVML reads, no Xid wait) with the floor's reading part, and the agent's sample
plus one render of a scrape with the floor's reading and writing.

    .venv/bin/python bench/floor.py [--tag after]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from agentproc import load  # noqa: E402
from common import RESULTS, percentile, record  # noqa: E402
from node_large import build  # noqa: E402

ROUNDS = 200
V1_FILES = {
    "cpuacct": ("cpuacct.usage",),
    "cpuset": ("cpuset.effective_cpus",),
    "memory": ("memory.usage_in_bytes", "memory.stat", "memory.limit_in_bytes",
               "memory.max_usage_in_bytes", "memory.oom_control"),
}


def _read(path: str) -> bytes:
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.read(fd, 65536)
    finally:
        os.close(fd)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tag", default="", help="which node_large results to compare with")
    args = parser.parse_args()
    agent_file = RESULTS / ("node_large" + (f"_{args.tag}" if args.tag else "") + ".json")
    agent = json.loads(agent_file.read_text())["variants"]["base"] if agent_file.exists() \
        else None
    with tempfile.TemporaryDirectory(prefix="sge-bench-") as tmp:
        node, _ = build(Path(tmp), "base")
        files, leaves = [], []
        for job in node.jobs.values():
            for ctrl, names in V1_FILES.items():
                files += [f"{node.job_dir(ctrl, job)}/{n}" for n in names]
            leaves.append(f"{node.job_dir('freezer', job)}/step_{job.step}/task_0/cgroup.procs")
        gpu_pids = [p for job in node.jobs.values() for p in job.pids]
        proc = os.fspath(node.proc_root)
        spool = os.fspath(node.spool_dir)
        series = agent["series"] if agent else 1200
        read_ms, write_ms = [], []
        for _ in range(ROUNDS):
            t0 = time.process_time()
            values = [len(_read(f)) for f in files]
            pids = [int(x) for leaf in leaves for x in _read(leaf).split()]
            for pid in gpu_pids:
                _read(f"{proc}/{pid}/stat")
            os.listdir(spool)
            t1 = time.process_time()
            lines = [f'slurm_job_metric_{i % 20}{{jobid="{10000 + i % 64}",user="sgeuser",'
                     f'gpu="{i % 8}",uuid="GPU-00000000-0000-0000-0000-00000000000{i % 8}"}} '
                     f"{values[i % len(values)] + len(pids)}\n" for i in range(series)]
            body = "".join(lines).encode()
            t2 = time.process_time()
            read_ms.append((t1 - t0) * 1000)
            write_ms.append((t2 - t1) * 1000)
            assert body
    floor_read = percentile(read_ms, 50)
    floor_write = percentile(write_ms, 50)
    figures: dict[str, object] = {
        "command": "python bench/floor.py " + " ".join(sys.argv[1:]),
        "node": "node-large base: 64 jobs, 512 GPU processes, 4,000 other processes",
        "files_read_per_sample": len(files) + len(leaves) + len(gpu_pids),
        "series_written": series,
        "floor_read_cpu_ms_p50": round(floor_read, 2),
        "floor_write_cpu_ms_p50": round(floor_write, 2),
        "load_1m": load(),
    }
    if agent:
        # The sampler thread's CPU is the sample without the NVML reads (their own
        # threads) and the Xid wait; older results without the split: total less the
        # NVML step's wall time.
        threads = agent.get("cpu_ms_per_sample_by_thread", {})
        sample = threads.get("sampler") or (
            agent["cpu_ms_per_sample"] - agent["last_sample_wall_ms_by_step"].get("nvml", 0.0))
        figures["compared_with"] = agent_file.name
        figures["agent_sample_cpu_ms_sampler_thread"] = round(sample, 2)
        figures["agent_over_floor_read"] = round(sample / floor_read, 1)
        figures["agent_sample_plus_render_over_floor"] = round(
            (sample + agent["first_scrape_of_snapshot_cpu_ms"]) / (floor_read + floor_write), 1)
    record("floor" + (f"_{args.tag}" if args.tag else ""), figures)


if __name__ == "__main__":
    main()
