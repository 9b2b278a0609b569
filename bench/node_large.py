"""node-large: the real agent over a synthetic node and the fake NVML.

Variants (each a fresh node and agent):
- ``base``: 8 GPUs, 64 jobs (one GPU each, 8 GPU processes each: 512), 4,000 other
  processes in /proc;
- ``procs40k``: the same with 40,000 other processes (the cost must stay flat);
- ``jobs256``: 256 jobs, two GPU processes each (512), 4,000 other processes;
- ``mig``: 8 GPUs x 7 MIG instances, 56 jobs (one instance each, 9 processes each).

For each: agent CPU per sample with no scrape (agent process CPU over the window /
samples), the NVML step's wall time (the fake library runs in the agent, and the
budget leaves the driver's time out), CPU per scrape, RSS and series count.

    .venv/bin/python bench/node_large.py [--interval 1] [--window 30] [variant ...]
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from agentproc import get, idle_cpu_per_sample, load, rss_mib, scrape_cpu, series_count  # noqa: E402
from common import record  # noqa: E402

from slurm_gpu_exporter.sim.synthnode import SynthNode  # noqa: E402
from tests.fakenvml import Device, FakeNvml, MigInstance, NvmlState, Pattern, Process  # noqa: E402
from tests.support.agent import Agent  # noqa: E402

GIB = 1 << 30
OTHER_UID = 2000
VARIANTS = {
    # name: (jobs, GPU processes per job, other processes, MIG instances per GPU)
    "base": (64, 8, 4_000, 0),
    "procs40k": (64, 8, 40_000, 0),
    "jobs256": (256, 2, 4_000, 0),
    "mig": (56, 9, 4_000, 7),
}


def _other_processes(proc_root: Path, first_pid: int, count: int) -> None:
    """Processes outside every job: the files a /proc scan would open (written plainly,
    which is far quicker than SynthNode.add_process for tens of thousands)."""
    for pid in range(first_pid, first_pid + count):
        d = proc_root / str(pid)
        d.mkdir()
        (d / "stat").write_text(f"{pid} (bash) S 1 {pid} {pid} 0 -1 4194304 0 0 0 0 "
                                f"5 1 0 0 20 0 1 0 {10_000 + pid}" + " 0" * 30 + "\n")
        (d / "status").write_text(f"Name:\tbash\nPid:\t{pid}\nUid:\t{OTHER_UID}\t{OTHER_UID}"
                                  f"\t{OTHER_UID}\t{OTHER_UID}\n")
        (d / "cgroup").write_text(f"0::/user.slice/user-{OTHER_UID}.slice/session-1.scope\n")


def build(base: Path, variant: str) -> tuple[SynthNode, FakeNvml]:
    jobs, per_job, others, mig = VARIANTS[variant]
    node = SynthNode(base / "node")
    fake = FakeNvml(base / "nvml")
    devices = [Device(g) for g in range(8)]
    pid = 100_000
    for j in range(jobs):
        gpu = j % 8
        pids = list(range(pid, pid + per_job))
        pid += per_job
        if mig:
            gi = 1 + (j // 8) % mig
            uuid = f"MIG-{gpu:04x}{gi:04x}-7e57-4a11-8c1d-000000000000"
            if not any(m.gpu_instance_id == gi for m in devices[gpu].mig):
                devices[gpu].mig.append(MigInstance(gi, uuid=uuid, memory_total=10 * GIB))
            node.add_job(10_000 + j, pids, job_gpus=str(gpu), cuda_visible_devices=uuid,
                         cpus=[j % 2])
            devices[gpu].processes += [Process(p, 256 << 20, gpu_instance_id=gi,
                                               compute_instance_id=0) for p in pids]
        else:
            node.add_job(10_000 + j, pids, job_gpus=str(gpu), cpus=[j % 2])
            devices[gpu].processes += [Process(p, 256 << 20, sm=Pattern.square(2, 5, 60))
                                       for p in pids]
    _other_processes(node.proc_root, 1_000_000, others)
    fake.write(NvmlState(devices=devices))
    return node, fake


_NVML_STEP = re.compile(rb'^slurm_gpu_exporter_sample_duration_seconds\{source="(\w+)"\} (\S+)$',
                        re.M)


def step_walls(url: str) -> dict[str, float]:
    """The last sample's wall time by step (ms), from the agent's own series."""
    body = get(url + "/metrics")
    return {m.group(1).decode(): round(float(m.group(2)) * 1000, 2)
            for m in _NVML_STEP.finditer(body)}


def run_variant(variant: str, interval: float, window: float) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="sge-bench-") as tmp:
        t0 = time.monotonic()
        node, fake = build(Path(tmp), variant)
        built = time.monotonic() - t0
        agent = Agent(node.agent_args(interval), env=fake.env(), log_path=Path(tmp) / "agent.log")
        try:
            agent.wait_ready(60)
            # Past the first samples (caches, NVML init) and the cgroup reader's new-job
            # window (10 s, its steps walked on every sample): a node's steady state.
            time.sleep(max(3 * interval, 12.0))
            pid = agent.proc.pid
            idle = idle_cpu_per_sample(pid, agent.url, interval, window)
            steps = step_walls(agent.url)
            scrapes = scrape_cpu(pid, agent.url, interval, snapshots=5, repeat=20)
            result = {
                **idle,
                "last_sample_wall_ms_by_step": steps,
                **scrapes,
                "rss_mib": round(rss_mib(pid), 1),
                "series": series_count(agent.url),
                "node_build_s": round(built, 1),
            }
        finally:
            agent.stop()
    print(variant, result, flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument("--window", type=float, default=30.0)
    parser.add_argument("--tag", default="", help="suffix of the results file (before/after)")
    parser.add_argument("variants", nargs="*", default=list(VARIANTS))
    args = parser.parse_args()
    results = {v: run_variant(v, args.interval, args.window) for v in args.variants}
    base = results.get("base", {}).get("cpu_ms_per_sample")
    many = results.get("procs40k", {}).get("cpu_ms_per_sample")
    figures: dict[str, object] = {
        "command": "python bench/node_large.py " + " ".join(sys.argv[1:]),
        "cpus": os.cpu_count(),
        "load_1m_at_end": load(),
        "sample_interval_s": args.interval,
        "window_s": args.window,
        "variants": results,
    }
    if base and many:
        figures["procs40k_over_base"] = round(many / base, 2)
    record("node_large" + (f"_{args.tag}" if args.tag else ""), figures)


if __name__ == "__main__":
    main()
